"""The math reward: every reference answer of examples/math.jsonl grades 1, wrong answers 0.

Runs the real math-verify (and the sympy fallback) on the shipped problems, so a reference
answer that the verifier cannot read is caught here rather than as a silent reward 0 in RL.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from agents.handlers.math.answer import answer_from_run, extract_boxed, grade_math_answer

MATH_JSONL = Path(__file__).resolve().parents[2] / "examples" / "math.jsonl"
PROBLEMS = [json.loads(line) for line in MATH_JSONL.read_text().splitlines() if line.strip()]
IDS = [p["instance_id"] for p in PROBLEMS]


def test_example_set_shape() -> None:
    assert len(PROBLEMS) >= 30
    assert len(set(IDS)) == len(IDS)
    for problem in PROBLEMS:
        assert set(problem) == {"instance_id", "problem", "answer"}
        assert problem["problem"].strip() and problem["answer"].strip()


@pytest.mark.parametrize("problem", PROBLEMS, ids=IDS)
def test_reference_answer_grades_one(problem: dict) -> None:
    ref = problem["answer"]
    assert grade_math_answer(ref, ref).reward == 1.0
    boxed = answer_from_run(None, f"So the result is \\boxed{{{ref}}}.")
    assert grade_math_answer(boxed, ref).reward == 1.0


@pytest.mark.parametrize("problem", PROBLEMS, ids=IDS)
def test_wrong_answer_grades_zero(problem: dict) -> None:
    ref = problem["answer"]
    assert grade_math_answer(f"{ref} + 1", ref).reward == 0.0
    assert grade_math_answer(f"2({ref})", ref).reward == 0.0  # no reference is 0


@pytest.mark.parametrize(
    "predicted, reference",
    [
        ("1/2", "\\frac{1}{2}"),
        ("0.5", "\\frac{1}{2}"),
        ("\\frac{1}{2}", "\\frac{1}{2}"),
        ("\\dfrac{1}{2}", "0.5"),
        ("$\\frac12$", "1/2"),
        ("50\\%", "\\frac{1}{2}"),
        ("sqrt(6)/4", "\\frac{\\sqrt{6}}{4}"),
        ("\\frac{\\sqrt{3}}{2\\sqrt{2}}", "\\frac{\\sqrt{6}}{4}"),
        ("25*pi", "25\\pi"),
        ("78.5398163", "25\\pi"),
        ("3*x**2 + 2", "3x^2 + 2"),
        ("2 + 3x^2", "3x^2 + 2"),
        ("5+I", "5 + i"),
        ("i + 5", "5 + i"),
        ("129/10", "12.9"),
        ("1,000", "1000"),
        ("10^3", "1000"),
        ("x = 12", "12"),
    ],
)
def test_equivalent_forms_grade_one(predicted: str, reference: str) -> None:
    assert grade_math_answer(predicted, reference).reward == 1.0


@pytest.mark.parametrize(
    "predicted, reference",
    [
        ("0.33", "\\frac{1}{3}"),
        ("0.333333333", "\\frac{1}{3}"),
        ("78.54", "25\\pi"),
        ("1/2", "\\frac{1}{3}"),
        ("5 - i", "5 + i"),
        ("8y", "8x"),
        ("x - 3", "x + 3"),
        ("one half", "\\frac{1}{2}"),
        ("", "1"),
        ("   ", "1"),
    ],
)
def test_near_misses_grade_zero(predicted: str, reference: str) -> None:
    assert grade_math_answer(predicted, reference).reward == 0.0


def test_hostile_answers_are_not_evaluated(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for text in (f"__import__('os').system('touch {marker}')", "9**9**9**9", "2**(10**100)", "exec('1')", "lambda: 1"):
        assert grade_math_answer(text, "42").reward == 0.0
    assert not marker.exists()


def test_no_answer_is_zero() -> None:
    grade = grade_math_answer(answer_from_run(None, "I could not solve it."), "3")
    assert (grade.reward, grade.method) == (0.0, "no_answer")


def test_finish_answer_wins_over_boxed_message() -> None:
    assert answer_from_run("7", "\\boxed{8}") == "7"
    assert answer_from_run("\\boxed{\\frac{1}{2}}", None) == "\\frac{1}{2}"
    assert answer_from_run("  ", "thus \\boxed{8}") == "8"


def test_extract_boxed_keeps_nested_braces() -> None:
    text = "a \\boxed{1} then \\boxed{\\frac{\\sqrt{6}}{4}} end"
    assert extract_boxed(text) == "\\frac{\\sqrt{6}}{4}"
    assert extract_boxed("\\fbox{12}") == "12"
    assert extract_boxed("\\boxed{unclosed") is None
    assert extract_boxed("no box") is None


def test_grading_off_the_main_thread_uses_a_child_process() -> None:
    """math-verify's SIGALRM timeout cannot run in a thread; the child-process path must agree."""
    results: list = []

    def grade_both() -> None:
        results.append(grade_math_answer("3*pi", "3\\pi"))
        results.append(grade_math_answer("3", "3\\pi"))

    worker = threading.Thread(target=grade_both)
    worker.start()
    worker.join(timeout=60)
    assert [r.reward for r in results] == [1.0, 0.0]
    assert results[0].method == "sympy"


@pytest.mark.parametrize(
    "predicted, reference, reward",
    [
        ("1000001", "1000000", 0.0),  # integer references are exact: no relative tolerance
        ("123456900", "123456789", 0.0),
        ("0.3333333", "1/3", 0.0),  # a rational reference needs the rational, not a rounding
        ("0.3333333", "\\frac{1}{3}", 0.0),
        ("1000000.0", "1000000", 1.0),  # the same number written as a decimal is exact
        ("10^6", "1000000", 1.0),
        ("\\frac{2}{6}", "\\frac{1}{3}", 1.0),
        ("0.5", "\\frac12", 1.0),
        ("2", "2.0", 1.0),
        ("3.141590001", "3.14159", 1.0),  # non-integer decimal reference: relative 1e-6
        ("3.1416", "3.14159", 0.0),
    ],
)
def test_exact_where_exact_is_meant(predicted: str, reference: str, reward: float) -> None:
    assert grade_math_answer(predicted, reference).reward == reward


def test_decimal_tolerance_is_configurable_and_only_for_decimals() -> None:
    assert grade_math_answer("3.1416", "3.14159", decimal_tolerance=1e-4).reward == 1.0
    assert grade_math_answer("1000001", "1000000", decimal_tolerance=1e-2).reward == 0.0
    from agents.handlers.math.handler import MathConfig

    assert MathConfig(decimal_tolerance=1e-3).decimal_tolerance == 1e-3
    with pytest.raises(ValueError, match="decimal_tolerance"):
        MathConfig(decimal_tolerance=0.5)
