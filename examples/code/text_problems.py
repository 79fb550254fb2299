"""Function-style problems on text (parsing, encoding, words) for examples/code.jsonl: the same
format as function_problems.py."""

TEXT_PROBLEMS: list[dict] = [
    dict(
        id="palindrome",
        statement="Write `is_palindrome(text)`: True when `text` reads the same backwards once "
        "case and every non-alphanumeric character are ignored.",
        solution="""def is_palindrome(text):
    chars = [c.lower() for c in text if c.isalnum()]
    return chars == chars[::-1]
""",
        tests=[
            "assert is_palindrome('A man, a plan, a canal: Panama')",
            "assert not is_palindrome('race a car')",
            "assert is_palindrome('')",
            "assert is_palindrome('No lemon, no melon!')",
            "assert not is_palindrome('ab')",
        ],
    ),
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
        id="rle-encode",
        statement="Write `rle_encode(text)` (run-length encoding): each run of a repeated "
        "character becomes the character followed by the run length, e.g. "
        "'aaabcc' -> 'a3b1c2'.",
        solution="""def rle_encode(text):
    out = []
    i = 0
    while i < len(text):
        j = i
        while j < len(text) and text[j] == text[i]:
            j += 1
        out.append(f"{text[i]}{j - i}")
        i = j
    return "".join(out)
""",
        tests=[
            "assert rle_encode('aaabcc') == 'a3b1c2'",
            "assert rle_encode('') == ''",
            "assert rle_encode('z') == 'z1'",
            "assert rle_encode('aaaaaaaaaaaa') == 'a12'",
            "assert rle_encode('abab') == 'a1b1a1b1'",
        ],
    ),
    dict(
        id="rle-decode",
        statement="Write `rle_decode(code)`, the inverse of run-length encoding where each "
        "character is followed by its count in decimal (counts may have several "
        "digits), e.g. 'a3b1c12' -> 'aaab' + 12 'c's. Characters are never digits.",
        solution="""def rle_decode(code):
    out = []
    i = 0
    while i < len(code):
        ch = code[i]
        j = i + 1
        while j < len(code) and code[j].isdigit():
            j += 1
        out.append(ch * int(code[i + 1:j]))
        i = j
    return "".join(out)
""",
        tests=[
            "assert rle_decode('a3b1c2') == 'aaabcc'",
            "assert rle_decode('') == ''",
            "assert rle_decode('x12') == 'xxxxxxxxxxxx'",
            "assert rle_decode('a1b1a1') == 'aba'",
        ],
    ),
    dict(
        id="brackets",
        statement="Write `balanced(text)`: True when the brackets (), [] and {} in `text` are "
        "balanced and properly nested; other characters are ignored.",
        solution="""def balanced(text):
    pairs = {")": "(", "]": "[", "}": "{"}
    stack = []
    for ch in text:
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                return False
    return not stack
""",
        tests=[
            "assert balanced('([]{})')",
            "assert not balanced('([)]')",
            "assert balanced('f(a[1], {b: 2})')",
            "assert not balanced('((')",
            "assert not balanced(')(')",
            "assert balanced('')",
        ],
    ),
    dict(
        id="word-count",
        statement="Write `word_count(text)` returning a dict mapping each lower-cased word to "
        "its number of occurrences; words are maximal runs of letters, digits and "
        "apostrophes.",
        solution="""import re


def word_count(text):
    counts = {}
    for word in re.findall(r"[A-Za-z0-9']+", text):
        word = word.lower()
        counts[word] = counts.get(word, 0) + 1
    return counts
""",
        tests=[
            "assert word_count('the cat the hat') == {'the': 2, 'cat': 1, 'hat': 1}",
            "assert word_count('Go, go, GO!') == {'go': 3}",
            "assert word_count(\"don't stop\") == {\"don't\": 1, 'stop': 1}",
            "assert word_count('') == {}",
        ],
    ),
    dict(
        id="common-prefix",
        statement="Write `common_prefix(words)` returning the longest prefix shared by every "
        "string in the list ('' for an empty list).",
        solution="""def common_prefix(words):
    if not words:
        return ""
    prefix = words[0]
    for word in words[1:]:
        while not word.startswith(prefix):
            prefix = prefix[:-1]
    return prefix
""",
        tests=[
            "assert common_prefix(['flower', 'flow', 'flight']) == 'fl'",
            "assert common_prefix(['dog', 'car']) == ''",
            "assert common_prefix([]) == ''",
            "assert common_prefix(['same', 'same']) == 'same'",
            "assert common_prefix(['', 'abc']) == ''",
        ],
    ),
    dict(
        id="anagram-groups",
        statement="Write `anagram_groups(words)` grouping words that are anagrams of each other; "
        "each group sorted alphabetically, groups sorted by their first word.",
        solution="""def anagram_groups(words):
    groups = {}
    for word in words:
        groups.setdefault("".join(sorted(word)), []).append(word)
    return sorted(sorted(g) for g in groups.values())
""",
        tests=[
            "assert anagram_groups(['eat', 'tea', 'tan', 'ate', 'nat', 'bat']) == "
            "[['ate', 'eat', 'tea'], ['bat'], ['nat', 'tan']]",
            "assert anagram_groups([]) == []",
            "assert anagram_groups(['a']) == [['a']]",
        ],
    ),
    dict(
        id="caesar",
        statement="Write `caesar(text, shift)` shifting ASCII letters by `shift` positions "
        "(wrapping, preserving case; shift may be negative or > 26); other characters "
        "stay as they are.",
        solution="""def caesar(text, shift):
    out = []
    for ch in text:
        if "a" <= ch <= "z":
            out.append(chr((ord(ch) - 97 + shift) % 26 + 97))
        elif "A" <= ch <= "Z":
            out.append(chr((ord(ch) - 65 + shift) % 26 + 65))
        else:
            out.append(ch)
    return "".join(out)
""",
        tests=[
            "assert caesar('abc', 1) == 'bcd'",
            "assert caesar('xyz', 3) == 'abc'",
            "assert caesar('Hello, World!', 13) == 'Uryyb, Jbeyq!'",
            "assert caesar('abc', -1) == 'zab'",
            "assert caesar('abc', 52) == 'abc'",
            "assert caesar('é1', 5) == 'é1'",
        ],
    ),
    dict(
        id="duration",
        statement="Write `parse_duration(text)` turning strings like '1h30m', '45s', "
        "'2h5s' or '1d2h' into seconds (units d, h, m, s, each at most once, in that "
        "order); raise ValueError on anything else, including ''.",
        solution="""import re

_PATTERN = re.compile(r"(?:(\\d+)d)?(?:(\\d+)h)?(?:(\\d+)m)?(?:(\\d+)s)?")


def parse_duration(text):
    match = _PATTERN.fullmatch(text)
    if not text or not match:
        raise ValueError(f"bad duration {text!r}")
    d, h, m, s = (int(g) if g else 0 for g in match.groups())
    return ((d * 24 + h) * 60 + m) * 60 + s
""",
        tests=[
            "assert parse_duration('1h30m') == 5400",
            "assert parse_duration('45s') == 45",
            "assert parse_duration('1d2h') == 93600",
            "assert parse_duration('2h5s') == 7205",
            dict(
                call="[raised(parse_duration, bad) for bad in ['', '5', '1m1h', 'abc', '1h 2m']]",
                expected=repr(["ValueError"] * 5),
            ),
        ],
    ),
]
