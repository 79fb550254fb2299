"""Input/output problems in the style of APPS / CodeContests: the solution is a script reading
stdin; its stdout is compared on the host."""

IO_PROBLEMS: list[dict] = [
    dict(
        id="io-pair-sums",
        statement="Write a program (stdin to stdout). The first line holds n; each of the next n "
        "lines holds two integers a and b. Print a + b for each pair, one per line.",
        solution="""import sys

data = sys.stdin.read().split()
n = int(data[0])
print("\\n".join(str(int(data[1 + 2 * i]) + int(data[2 + 2 * i])) for i in range(n)))
""",
        tests=[
            dict(input="2\n1 2\n10 -3\n", output="3\n7\n"),
            dict(input="1\n0 0\n", output="0\n"),
            dict(input="3\n1000000000000 1\n-5 -5\n7 8\n", output="1000000000001\n-10\n15\n"),
        ],
    ),
    dict(
        id="io-reverse-words",
        statement="Write a program (stdin to stdout) that prints every input line with its "
        "words (separated by spaces) in reverse order.",
        solution="""import sys

for line in sys.stdin.read().splitlines():
    print(" ".join(reversed(line.split())))
""",
        tests=[
            dict(input="hello world\n", output="world hello\n"),
            dict(input="a b c\nsingle\n", output="c b a\nsingle\n"),
            dict(input="  spaced   out  \n", output="out spaced\n"),
        ],
    ),
]
