"""Function-style problems for examples/code.jsonl: `solution.py` defines a function; hidden
tests call it (assert snippets become `{call, expected}` tests, see build_problems.py)."""

PROBLEMS: list[dict] = [
    dict(
        id="fizzbuzz",
        statement="Write `fizzbuzz(n)` returning a list of strings for 1..n: 'Fizz' for multiples "
        "of 3, 'Buzz' for multiples of 5, 'FizzBuzz' for both, else the number.",
        solution="""def fizzbuzz(n):
    out = []
    for i in range(1, n + 1):
        word = ("Fizz" if i % 3 == 0 else "") + ("Buzz" if i % 5 == 0 else "")
        out.append(word or str(i))
    return out
""",
        tests=[
            "assert fizzbuzz(5) == ['1', '2', 'Fizz', '4', 'Buzz']",
            "assert fizzbuzz(15)[-1] == 'FizzBuzz'",
            "assert fizzbuzz(0) == []",
            "assert fizzbuzz(30).count('FizzBuzz') == 2",
        ],
    ),
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
        id="two-sum",
        statement="Write `two_sum(nums, target)` returning a tuple (i, j) with i < j and "
        "nums[i] + nums[j] == target. Exactly one such pair exists. Must handle "
        "100000 numbers quickly.",
        solution="""def two_sum(nums, target):
    seen = {}
    for j, x in enumerate(nums):
        if target - x in seen:
            return (seen[target - x], j)
        seen.setdefault(x, j)
    raise ValueError("no pair")
""",
        tests=[
            "assert two_sum([2, 7, 11, 15], 9) == (0, 1)",
            "assert two_sum([3, 2, 4], 6) == (1, 2)",
            "assert two_sum([-3, 4, 3, 90], 0) == (0, 2)",
            dict(
                setup="nums = list(range(0, 200000, 2)) + [7]",
                call="two_sum(nums, 199998 + 7)",
                expected="(99999, 100000)",
            ),
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
        id="flatten",
        statement="Write `flatten(items)` returning a flat list of all non-list values in a "
        "list that may contain nested lists to any depth, in order.",
        solution="""def flatten(items):
    out = []
    for item in items:
        if isinstance(item, list):
            out.extend(flatten(item))
        else:
            out.append(item)
    return out
""",
        tests=[
            "assert flatten([1, [2, [3, [4]]], 5]) == [1, 2, 3, 4, 5]",
            "assert flatten([]) == []",
            "assert flatten([[], [[]]]) == []",
            "assert flatten(['a', ('b',), ['c']]) == ['a', ('b',), 'c']",
        ],
    ),
    dict(
        id="transpose",
        statement="Write `transpose(matrix)` for a rectangular list of lists (possibly empty).",
        solution="""def transpose(matrix):
    return [list(row) for row in zip(*matrix)]
""",
        tests=[
            "assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]",
            "assert transpose([]) == []",
            "assert transpose([[1]]) == [[1]]",
            dict(setup="m = [[1, 2], [3, 4]]\ntransposed = transpose(m)", call="m", expected="[[1, 2], [3, 4]]"),
        ],
    ),
    dict(
        id="binary-search",
        statement="Write `find_first(sorted_list, x)` returning the index of the first "
        "occurrence of x in an ascending list, or -1. It must run in O(log n).",
        solution="""def find_first(sorted_list, x):
    lo, hi = 0, len(sorted_list)
    while lo < hi:
        mid = (lo + hi) // 2
        if sorted_list[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < len(sorted_list) and sorted_list[lo] == x else -1
""",
        tests=[
            "assert find_first([1, 2, 2, 2, 3], 2) == 1",
            "assert find_first([], 5) == -1",
            "assert find_first([1, 3, 5], 4) == -1",
            "assert find_first([5, 5, 5], 5) == 0",
            dict(
                setup="big = list(range(10_000_000))",
                call="all(find_first(big, 9_999_999) == 9_999_999 for _ in range(100000))",
                expected="True",
            ),
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
        id="spiral",
        statement="Write `spiral(matrix)` returning the elements of a rectangular matrix in "
        "clockwise spiral order starting at the top-left.",
        solution="""def spiral(matrix):
    out = []
    rows = [list(r) for r in matrix]
    while rows:
        out.extend(rows.pop(0))
        rows = [list(r) for r in zip(*rows)][::-1]
    return out
""",
        tests=[
            "assert spiral([[1, 2, 3], [4, 5, 6], [7, 8, 9]]) == [1, 2, 3, 6, 9, 8, 7, 4, 5]",
            "assert spiral([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]) == [1, 2, 3, 4, 8, 12, 11, 10, 9, 5, 6, 7]",
            "assert spiral([]) == []",
            "assert spiral([[1], [2], [3]]) == [1, 2, 3]",
        ],
    ),
    dict(
        id="chunks",
        statement="Write `chunks(items, size)` splitting a list into consecutive lists of "
        "`size` items (the last may be shorter); raise ValueError when size < 1.",
        solution="""def chunks(items, size):
    if size < 1:
        raise ValueError("size must be positive")
    return [items[i:i + size] for i in range(0, len(items), size)]
""",
        tests=[
            "assert chunks([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]",
            "assert chunks([], 3) == []",
            "assert chunks([1, 2], 5) == [[1, 2]]",
            dict(call="chunks([1], 0)", raises="ValueError"),
        ],
    ),
    dict(
        id="merge-sorted",
        statement="Write `merge_sorted(a, b)` merging two ascending lists into one ascending "
        "list in linear time (do not call sort/sorted).",
        solution="""def merge_sorted(a, b):
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        if b[j] < a[i]:
            out.append(b[j])
            j += 1
        else:
            out.append(a[i])
            i += 1
    return out + a[i:] + b[j:]
""",
        tests=[
            "assert merge_sorted([1, 4, 9], [2, 3, 10]) == [1, 2, 3, 4, 9, 10]",
            "assert merge_sorted([], [1]) == [1]",
            "assert merge_sorted([], []) == []",
            "assert merge_sorted([1, 1], [1]) == [1, 1, 1]",
        ],
    ),
    dict(
        id="islands",
        statement="Write `count_islands(grid)` counting groups of '1' cells connected "
        "horizontally or vertically in a list of equal-length strings of '0'/'1'.",
        solution="""def count_islands(grid):
    seen = set()
    count = 0
    for r, row in enumerate(grid):
        for c, cell in enumerate(row):
            if cell != "1" or (r, c) in seen:
                continue
            count += 1
            stack = [(r, c)]
            seen.add((r, c))
            while stack:
                y, x = stack.pop()
                for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                    if 0 <= ny < len(grid) and 0 <= nx < len(grid[ny]) \\
                            and grid[ny][nx] == "1" and (ny, nx) not in seen:
                        seen.add((ny, nx))
                        stack.append((ny, nx))
    return count
""",
        tests=[
            "assert count_islands(['11000', '11000', '00100', '00011']) == 3",
            "assert count_islands([]) == 0",
            "assert count_islands(['0']) == 0",
            "assert count_islands(['101', '010', '101']) == 5",
            "assert count_islands(['1' * 300] * 300) == 1",
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
