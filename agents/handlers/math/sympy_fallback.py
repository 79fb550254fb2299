"""The sympy-equivalence fallback for math answers written in Python syntax.

math-verify reads LaTeX and plain numbers well but misreads Python-style answers that agents
with a Python tool naturally produce (`x**2 + 1`, `3*pi`, `sqrt(2)/2`). This module parses such
answers with sympy. The answer comes from a model and `parse_expr` evaluates code, so the input
is held to a small alphabet and an allow-list of names, parsed unevaluated, and rejected if it
holds numbers big enough to make evaluation itself the attack (`9**9**9**9`).
"""

from __future__ import annotations

import re

import sympy
from sympy.parsing.sympy_parser import (
    convert_xor,
    implicit_multiplication_application,
    parse_expr,
    standard_transformations,
)

MAX_CHARS = 300
MAX_EXPONENT = 200
MAX_DIGITS = 60

_ALLOWED_CHARS = re.compile(r"^[0-9A-Za-z_.+\-*/^(),\s]*$")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_FUNCTIONS: dict[str, object] = {
    "sqrt": sympy.sqrt,
    "exp": sympy.exp,
    "log": sympy.log,
    "ln": sympy.log,
    "sin": sympy.sin,
    "cos": sympy.cos,
    "tan": sympy.tan,
    "asin": sympy.asin,
    "acos": sympy.acos,
    "atan": sympy.atan,
    "Abs": sympy.Abs,
    "abs": sympy.Abs,
    "Rational": sympy.Rational,
    "pi": sympy.pi,
    "E": sympy.E,
    "I": sympy.I,
    "oo": sympy.oo,
    "inf": sympy.oo,
    "binomial": sympy.binomial,
}
# What parse_expr's generated code calls; no builtins, so nothing else is reachable.
_CONSTRUCTORS: dict[str, object] = {
    name: getattr(sympy, name) for name in ("Integer", "Float", "Rational", "Symbol", "Add", "Mul", "Pow", "Function")
}
_TRANSFORMS = standard_transformations + (implicit_multiplication_application, convert_xor)


def parse_python_math(text: str) -> sympy.Expr | None:
    """Parse an answer such as `3*pi` or `x^2+1` into sympy, or None if it is not safe/valid."""
    text = text.strip().rstrip(".")
    if not text or len(text) > MAX_CHARS or "__" in text or not _ALLOWED_CHARS.match(text):
        return None
    local: dict[str, object] = {}
    for name in set(_IDENTIFIER.findall(text)):
        if name in _FUNCTIONS:
            local[name] = _FUNCTIONS[name]
        elif len(name) == 1:  # single-letter variables only: no access to other names
            local[name] = sympy.Symbol(name)
        else:
            return None
    global_dict: dict[str, object] = {"__builtins__": {}, **_CONSTRUCTORS}
    try:
        expr = parse_expr(text, local_dict=local, global_dict=global_dict, transformations=_TRANSFORMS, evaluate=False)
    except Exception:  # noqa: BLE001 - any parse failure just means "not this form"
        return None
    if not isinstance(expr, sympy.Expr) or not _small_enough(expr):
        return None
    return expr


def _small_enough(expr: sympy.Expr) -> bool:
    """False if evaluating `expr` could blow up (huge literals or exponents)."""
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, sympy.Integer) and len(str(abs(int(node)))) > MAX_DIGITS:
            return False
        if isinstance(node, sympy.Pow) and node.exp.is_Number and abs(node.exp) > MAX_EXPONENT:
            return False
        if isinstance(node, sympy.Pow) and not node.exp.is_Number and node.exp.has(sympy.Pow):
            return False  # towers such as a**b**c are never a reasonable final answer
    return True


def exact_value(expr: sympy.Basic) -> sympy.Expr | None:
    """`expr` as an exact number (decimals read as the rationals they spell), or None."""
    if not isinstance(expr, sympy.Expr) or expr.free_symbols or not _small_enough(expr):
        return None
    expr = expr.doit()
    return expr.xreplace({f: sympy.Rational(str(f)) for f in expr.atoms(sympy.Float)})


def exactly_equal(gold: sympy.Rational, predicted: sympy.Basic) -> bool:
    """True only if `predicted` is exactly the rational number `gold` (1000001 != 1000000)."""
    value = exact_value(predicted)
    if value is None or not value.is_number:
        return False
    try:
        return bool(sympy.simplify(value - gold) == 0)
    except Exception:  # noqa: BLE001 - sympy may raise on odd inputs; unequal then
        return False


def within_tolerance(gold: sympy.Expr, predicted: sympy.Basic, tolerance: float) -> bool:
    """True if two closed numbers differ by at most `tolerance` relative (at least absolute)."""
    if not isinstance(predicted, sympy.Expr) or predicted.free_symbols or not _small_enough(predicted):
        return False
    try:
        g, p = complex(sympy.N(gold, 30)), complex(sympy.N(predicted.doit(), 30))
    except (TypeError, ValueError):
        return False
    return abs(g - p) <= tolerance * max(1.0, abs(g))


def sympy_equivalent(gold: sympy.Basic, predicted: sympy.Expr) -> bool:
    """True if the two expressions are equal symbolically (no numeric tolerance here)."""
    if not isinstance(gold, sympy.Expr):
        return False
    predicted = predicted.doit()
    if predicted.has(sympy.I):  # a LaTeX reference writes the imaginary unit as the letter i
        gold = gold.xreplace({s: sympy.I for s in gold.free_symbols if s.name == "i"})
    if {s.name for s in gold.free_symbols} != {s.name for s in predicted.free_symbols}:
        return False
    # Symbols from different parsers are distinct objects: rebind the prediction's by name.
    names = {s.name: s for s in gold.free_symbols}
    predicted = predicted.xreplace({s: names[s.name] for s in predicted.free_symbols})
    try:
        return sympy.simplify(gold - predicted) == 0
    except Exception:  # noqa: BLE001 - sympy may raise on odd inputs; unequal then
        return False
