"""Function-style problems on numbers for examples/code.jsonl (numerals, primes, divisors,
sequences): the same format as function_problems.py (see build_problems.py)."""

NUMBER_PROBLEMS: list[dict] = [
    dict(
        id="roman-to-int",
        statement="Write `roman_to_int(s)` converting a Roman numeral (I, V, X, L, C, D, M with "
        "subtractive pairs like IV and CM) to an int.",
        solution="""def roman_to_int(s):
    values = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
    total = 0
    for i, ch in enumerate(s):
        v = values[ch]
        if i + 1 < len(s) and values[s[i + 1]] > v:
            total -= v
        else:
            total += v
    return total
""",
        tests=[
            "assert roman_to_int('III') == 3",
            "assert roman_to_int('IV') == 4",
            "assert roman_to_int('MCMXCIV') == 1994",
            "assert roman_to_int('MMXXIV') == 2024",
            "assert roman_to_int('XLIX') == 49",
        ],
    ),
    dict(
        id="int-to-roman",
        statement="Write `int_to_roman(n)` for 1 <= n <= 3999, using subtractive pairs (4 is 'IV', 900 is 'CM').",
        solution="""def int_to_roman(n):
    table = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
             (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
    out = []
    for value, letters in table:
        count, n = divmod(n, value)
        out.append(letters * count)
    return "".join(out)
""",
        tests=[
            "assert int_to_roman(3) == 'III'",
            "assert int_to_roman(58) == 'LVIII'",
            "assert int_to_roman(1994) == 'MCMXCIV'",
            "assert int_to_roman(3999) == 'MMMCMXCIX'",
            "assert int_to_roman(444) == 'CDXLIV'",
        ],
    ),
    dict(
        id="primes",
        statement="Write `primes_up_to(n)` returning the sorted list of primes <= n. It must "
        "handle n = 2_000_000 within a few seconds.",
        solution="""def primes_up_to(n):
    if n < 2:
        return []
    sieve = bytearray([1]) * (n + 1)
    sieve[0:2] = b"\\x00\\x00"
    for p in range(2, int(n ** 0.5) + 1):
        if sieve[p]:
            sieve[p * p::p] = bytearray(len(range(p * p, n + 1, p)))
    return [i for i, flag in enumerate(sieve) if flag]
""",
        tests=[
            "assert primes_up_to(10) == [2, 3, 5, 7]",
            "assert primes_up_to(1) == []",
            "assert primes_up_to(2) == [2]",
            "assert len(primes_up_to(2_000_000)) == 148933",
        ],
    ),
    dict(
        id="gcd-list",
        statement="Write `gcd_list(numbers)` returning the greatest common divisor of a "
        "non-empty list of non-negative ints (gcd of all zeros is 0).",
        solution="""def gcd_list(numbers):
    result = 0
    for x in numbers:
        a, b = result, x
        while b:
            a, b = b, a % b
        result = a
    return result
""",
        tests=[
            "assert gcd_list([12, 18, 24]) == 6",
            "assert gcd_list([7]) == 7",
            "assert gcd_list([0, 0]) == 0",
            "assert gcd_list([0, 9]) == 9",
            "assert gcd_list([17, 34, 51, 5]) == 1",
        ],
    ),
    dict(
        id="fibonacci-mod",
        statement="Write `fib_mod(n, m)` returning the n-th Fibonacci number (fib(0) = 0, "
        "fib(1) = 1) modulo m, for n up to 10**18, in well under a second.",
        solution="""def fib_mod(n, m):
    def pair(k):
        if k == 0:
            return 0, 1
        a, b = pair(k // 2)
        c = a * ((2 * b - a) % m) % m
        d = (a * a + b * b) % m
        return (d, (c + d) % m) if k % 2 else (c, d)
    return pair(n)[0] % m
""",
        tests=[
            "assert [fib_mod(i, 1000) for i in range(8)] == [0, 1, 1, 2, 3, 5, 8, 13]",
            "assert fib_mod(90, 10**19) == 2880067194370816120",
            "assert fib_mod(10**18, 1_000_000_007) == 209783453",
            "assert fib_mod(5, 1) == 0",
        ],
    ),
    dict(
        id="digital-root",
        statement="Write `digital_root(n)`: repeatedly sum the decimal digits of a "
        "non-negative int until a single digit remains.",
        solution="""def digital_root(n):
    while n >= 10:
        n = sum(int(d) for d in str(n))
    return n
""",
        tests=[
            "assert digital_root(0) == 0",
            "assert digital_root(16) == 7",
            "assert digital_root(942) == 6",
            "assert digital_root(10**100 - 1) == 9",
        ],
    ),
]
