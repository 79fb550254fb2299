"""The simulator's built-in demo policy (a fake model, named as such): solves `examples/math.jsonl`
through the `python` tool, so a machine without a GPU sees the whole pipeline produce reward 1.

Turn 1: it recognises the problem in the prompt and calls `python` with a short program that
computes the answer (sympy is in the `math` environment). Turn 2: it reads the tool's output
from the prompt and calls `finish` with it. A problem it does not know gets a reply with no
tool call and no answer, which the math handler grades 0. The programs are written per example
problem: this is a scripted stand-in for a model, not a solver.
"""

from __future__ import annotations

import json
import re

S = "import sympy as sp\nx = sp.Symbol('x')\n"
PROGRAMS: dict[str, str] = {
    "positive divisors of 360": S + "print(sp.divisor_sigma(360))",
    "club has 11 members": "import math\nprint(math.comb(11, 4))",
    "add up to 9": "from fractions import Fraction\n"
    "print(Fraction(sum(a + b == 9 for a in range(1, 7) for b in range(1, 7)), 36))",
    "3x - 7 = 2x + 5": S + "print(sp.solve(3*x - 7 - (2*x + 5), x)[0])",
    "7^{2026} is divided by 13": "print(pow(7, 2026, 13))",
    "inscribed in a square whose side length is 10": S + "print(sp.pi * 5**2)",
    "\\sin(\\pi/4) \\cdot \\cos(\\pi/6)": S + "print(sp.sin(sp.pi/4) * sp.cos(sp.pi/6))",
    "\\int_0^1 x e^x": S + "print(sp.integrate(x*sp.exp(x), (x, 0, 1)))",
    "roots of 2x^2 - 7x + 3": S + "print(sum(sp.solve(2*x**2 - 7*x + 3, x)))",
    "100! end with": "import math\ns = str(math.factorial(100))\nprint(len(s) - len(s.rstrip('0')))",
    "1071 and 462": "import math\nprint(math.gcd(1071, 462))",
    "12, 18 and 30": "import math\nprint(math.lcm(12, 18, 30))",
    "F_{20}": "a, b = 1, 1\nfor _ in range(18):\n    a, b = b, a + b\nprint(b)",
    "(x+2)^2 - (x-2)^2": S + "print(sp.expand((x + 2)**2 - (x - 2)**2))",
    "\\frac{x^2 - 9}{x - 3}": S + "print(sp.cancel((x**2 - 9)/(x - 3)))",
    "n! is greater than one million": "import math\nn = 1\nwhile math.factorial(n) <= 10**6:\n    n += 1\nprint(n)",
    "x + y = 10 and x - y = 4": "x, y = 7, 3\nassert x + y == 10 and x - y == 4\nprint(x*x + y*y)",
    "1^2 + 2^2 + 3^2": "print(sum(k*k for k in range(1, 51)))",
    "(1, 2) and (7, 10)": "import math\nprint(math.dist((1, 2), (7, 10)))",
    "\\log_2 32 + \\log_3": S + "print(sp.log(32, 2) + sp.log(sp.Rational(1, 9), 3))",
    "\\sqrt{50}": S + "print(sp.sqrt(50))",
    "3 + 1 + \\frac{1}{3}": S + "print(sp.Rational(3) / (1 - sp.Rational(1, 3)))",
    "letters of the word LEVEL": "import math\nprint(math.factorial(5) // (math.factorial(2) * math.factorial(2)))",
    "(2 + 3i)(1 - i)": S + "print(sp.expand((2 + 3*sp.I) * (1 - sp.I)))",
    "rows (4, 7) and (2, 6)": S + "print(sp.Matrix([[4, 7], [2, 6]]).det())",
    "legs of length 9 and 12": "import math\nprint(9 + 12 + math.isqrt(9*9 + 12*12))",
    "2^{x+1} = 64": S + "print(sp.solve(2**(x + 1) - 64, x)[0])",
    "first ten prime numbers": S + "print(sum(sp.prime(k) for k in range(1, 11)) / 10)",
    "sphere of radius 3": S + "print(sp.Rational(4, 3) * sp.pi * 3**3)",
    "divisible by 3 or by 5": "print(sum(1 for k in range(1, 101) if k % 3 == 0 or k % 5 == 0))",
    "largest prime factor of 1001": S + "print(max(sp.primefactors(1001)))",
    "i^{2026}": S + "print(sp.I**2026)",
    "\\frac{\\sin(5x)}{x}": S + "print(sp.limit(sp.sin(5*x)/x, x, 0))",
    "\\cos^2 x": S + "print(sp.integrate(sp.cos(x)**2, (x, 0, sp.pi/2)))",
    "coin is tossed three times": "from fractions import Fraction\nprint(1 - Fraction(1, 2)**3)",
    "x^2 - 6x + 11": S + "f = x**2 - 6*x + 11\nprint(f.subs(x, sp.solve(sp.diff(f, x), x)[0]))",
    "polygon with 12 sides": "n = 12\nprint(n * (n - 3) // 2)",
    "interior angles of a hexagon": "print((6 - 2) * 180)",
    "\\log_{10} x = 3": "print(10**3)",
    "1000 dollars earns 10%": "print(round(1000 * 1.1**2))",
    "x^3 + 2x": S + "print(sp.diff(x**3 + 2*x, x))",
    "relatively prime to 12": "import math\nfrom fractions import Fraction\n"
    "print(Fraction(sum(math.gcd(k, 12) == 1 for k in range(1, 13)), 12))",
}
TOOL_TURN = re.compile(r"<\|im_start\|>(?:tool|user)\n(.*?)<\|im_end\|>", re.DOTALL)
UNKNOWN = "I do not know how to solve this problem."


def tool_call(name: str, **arguments: object) -> str:
    """A Hermes-style tool call, as the math handler parses it."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def demo_math_reply(prompt_text: str, turn: int) -> str:
    """The reply to a rendered prompt: compute with `python` first, then `finish` with its output."""
    if turn == 0:
        program = next((code for key, code in PROGRAMS.items() if key in prompt_text), None)
        return tool_call("python", code=program) if program else UNKNOWN
    observations = TOOL_TURN.findall(prompt_text)
    answer = observations[-1].strip().splitlines()[-1].strip() if observations else ""
    return tool_call("finish", answer=answer) if answer else UNKNOWN
