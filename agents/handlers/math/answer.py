"""Grade a math answer against a reference: math-verify first, sympy equivalence second.

The prediction is what the agent passed to `finish(answer)`, or else the last `\\boxed{...}`
of its final message. How close is close enough depends on the reference: an integer or
rational reference (`1000000`, `3/4`, `\\frac{3}{4}`, `2.0`) needs the exact number (so
`1000001` never scores for `1000000`, nor `0.3333333` for `1/3`); a non-integer decimal
reference (`3.14159`) accepts a relative `decimal_tolerance` (job config); any other reference
(`2\\sqrt{3}`, `x^2+1`, sets, intervals) goes to math-verify, then sympy equivalence. A bare answer
(`1/2`, `\\frac{1}{2}`, `0.5`) is read as a formula, not
searched for numbers in prose, because math-verify's prose extraction turns `3\\pi` into `3`.

math-verify bounds its parsing and comparison with `signal.alarm`, which only works in a
process's main thread. In the main thread (a prefork worker, a test) we grade in-process; from
any other thread (a threaded worker pool) we grade in a persistent child process
(`agents.warm_worker`: the grader imported once) that is killed at the timeout and
restarted, so a pathological answer can never wedge a worker.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import asdict, dataclass
from functools import lru_cache

logger = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 2000
DECIMAL_TOLERANCE = 1e-6
_DECIMAL = re.compile(r"\d?\.\d")
_WARM_TARGET = "agents.handlers.math.answer:_grade_request"


@dataclass
class MathGrade:
    """The reward and how it was reached: exact, decimal, math_verify, sympy, no_answer,
    timeout or none."""

    reward: float
    method: str
    predicted: str | None = None


def extract_boxed(text: str | None) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced."""
    if not text:
        return None
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, begin = 1, i
    while i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[begin:i].strip()
        i += 1
    return None


def answer_from_run(answer: str | None, final_message: str | None) -> str | None:
    """The answer to grade: the finish tool's argument, else the final message's `\\boxed{}`."""
    if answer is not None and str(answer).strip():
        text = str(answer).strip()
        return extract_boxed(text) or text
    return extract_boxed(final_message)


def _as_latex(text: str) -> str:
    """Wrap a bare answer in `$...$` so math-verify reads all of it as one formula."""
    if any(mark in text for mark in ("$", "\\(", "\\[", "\\boxed")):
        return text
    return f"${text}$"


@lru_cache(maxsize=4096)
def _parse_reference(reference: str) -> list:
    """Parsed reference answer (cached: every sample of a GRPO group shares it)."""
    from math_verify import parse

    return parse(_as_latex(reference))


def _grade_here(
    predicted: str, reference: str, timeout_s: int, decimal_tolerance: float = DECIMAL_TOLERANCE
) -> MathGrade:
    """Grade in this thread (must be the main thread: math-verify uses SIGALRM)."""
    from math_verify.errors import TimeoutException

    try:
        return _grade_unguarded(predicted, reference, timeout_s, decimal_tolerance)
    except TimeoutException:  # a BaseException: math-verify's own handlers let it through
        return MathGrade(0.0, "timeout", predicted)


def reference_kind(reference: str, gold: list) -> str:
    """ "exact" (integer/rational), "decimal" (non-integer decimal) or "symbolic"."""
    import sympy

    exprs = [g for g in gold if isinstance(g, sympy.Expr)]
    if not exprs or exprs[0].free_symbols or not exprs[0].is_number:
        return "symbolic"
    value = exprs[0]
    if isinstance(value, sympy.Float):
        return "exact" if float(value).is_integer() else "decimal"
    if isinstance(value, sympy.Rational):
        decimal = _DECIMAL.search(reference) is not None
        return "decimal" if decimal and not value.is_Integer else "exact"
    return "symbolic"


def _candidates(predicted: str, timeout_s: int) -> list:
    """Every reading of the prediction: math-verify's and the Python-syntax parser's."""
    from math_verify import parse
    from math_verify.utils import timeout

    from agents.handlers.math.sympy_fallback import parse_python_math

    import sympy

    found = []
    for parsed in parse(_as_latex(predicted), parsing_timeout=timeout_s):
        if isinstance(parsed, sympy.Eq) and isinstance(parsed.lhs, sympy.Symbol):
            parsed = parsed.rhs  # "x = 12" answers 12
        if not isinstance(parsed, str):
            found.append(parsed)
    py_pred = timeout(timeout_seconds=timeout_s)(parse_python_math)(predicted)
    return found + ([py_pred] if py_pred is not None else [])


def _grade_unguarded(
    predicted: str, reference: str, timeout_s: int, decimal_tolerance: float = DECIMAL_TOLERANCE
) -> MathGrade:
    """Exact, decimal or symbolic comparison per the reference; each step bounded by SIGALRM."""
    from math_verify import parse, verify
    from math_verify.utils import timeout

    from agents.handlers.math.sympy_fallback import exactly_equal, sympy_equivalent, within_tolerance

    gold = _parse_reference(reference)
    kind = reference_kind(reference, gold)
    if kind in ("exact", "decimal"):
        value = next(g for g in gold if not isinstance(g, str))
        same = exactly_equal if kind == "exact" else (lambda g, p: within_tolerance(g, p, decimal_tolerance))
        for candidate in _candidates(predicted, timeout_s):
            if timeout(timeout_seconds=timeout_s)(same)(value, candidate):
                return MathGrade(1.0, kind, predicted)
        return MathGrade(0.0, "none", predicted)
    pred = parse(_as_latex(predicted), parsing_timeout=timeout_s)
    if gold and pred and verify(gold, pred, timeout_seconds=timeout_s):
        return MathGrade(1.0, "math_verify", predicted)
    gold_exprs = [g for g in gold if not isinstance(g, str)]
    if gold_exprs:
        from agents.handlers.math.sympy_fallback import parse_python_math

        py_pred = timeout(timeout_seconds=timeout_s)(parse_python_math)(predicted)
        if py_pred is not None and timeout(timeout_seconds=timeout_s)(sympy_equivalent)(gold_exprs[0], py_pred):
            return MathGrade(1.0, "sympy", predicted)
    return MathGrade(0.0, "none", predicted)


def _grade_request(
    predicted: str, reference: str, timeout_s: int, decimal_tolerance: float = DECIMAL_TOLERANCE
) -> dict:
    """Warm-worker entry point (runs in that process's main thread): the grade as a dict."""
    return asdict(_grade_here(predicted, reference, timeout_s, decimal_tolerance))


def _grade_warm(
    predicted: str, reference: str, timeout_s: int, decimal_tolerance: float = DECIMAL_TOLERANCE
) -> MathGrade:
    """Grade in a persistent grading process (grader imported once; killed and restarted
    after the timeout or a crash)."""
    from agents.warm_worker import WorkerFailed, warm_pool

    pool = warm_pool(_WARM_TARGET, warmup=("sympy", "math_verify", "agents.handlers.math.sympy_fallback"))
    try:
        return MathGrade(
            **pool.call({"args": [predicted, reference, timeout_s, decimal_tolerance]}, timeout=4 * timeout_s + 15)
        )
    except WorkerFailed as exc:
        logger.warning("math grading failed: %s", exc)
        return MathGrade(0.0, "timeout" if "timed out" in str(exc) else "none", predicted)


def grade_math_answer(
    predicted: str | None,
    reference: str,
    *,
    timeout_s: int = 5,
    decimal_tolerance: float = DECIMAL_TOLERANCE,
) -> MathGrade:
    """Reward 1.0 if `predicted` is mathematically equivalent to `reference`, else 0.0.

    Graded here on the main thread; off it (a worker's thread), in a persistent grading
    process (SIGALRM-bounded steps need a main thread).
    """
    if predicted is None or not predicted.strip():
        return MathGrade(0.0, "no_answer", predicted)
    predicted = predicted.strip()[:MAX_ANSWER_CHARS]
    if threading.current_thread() is threading.main_thread():
        return _grade_here(predicted, reference, timeout_s, decimal_tolerance)
    return _grade_warm(predicted, reference, timeout_s, decimal_tolerance)
