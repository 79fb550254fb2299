"""Exact match and token F1 for short answers (the search handler's reward)."""

from __future__ import annotations

import pytest

from agents.handlers.search.text_match import exact_match, grade_text_answer, normalize_answer, token_f1


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The JSON module.", "json module"),
        ("  os.path.join() ", "os.path.join"),
        ("an __init__ method", "__init__ method"),
        ("a, b; and c!", "b and c"),
        ("collections.OrderedDict", "collections.ordereddict"),
    ],
)
def test_normalize(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


def test_exact_match_ignores_case_articles_and_punctuation() -> None:
    assert exact_match("The heapq module", "heapq module") == 1.0
    assert exact_match("heapq", "heapq module") == 0.0


def test_token_f1_partial_credit() -> None:
    assert token_f1("heapq module", "heapq") == pytest.approx(2 / 3)
    assert token_f1("bisect", "heapq") == 0.0
    assert token_f1("", "heapq") == 0.0


def test_grade_uses_best_alias_and_configured_metric() -> None:
    f1 = grade_text_answer("the sha256 function", ["SHA-256", "sha256"], metric="f1")
    assert (f1.best_alias, f1.exact_match) == ("sha256", 0.0)
    assert f1.reward == pytest.approx(2 / 3)
    em = grade_text_answer("SHA256", ["SHA-256", "sha256"], metric="exact_match")
    assert (em.reward, em.f1) == (1.0, 1.0)


def test_no_prediction_or_no_gold_is_zero() -> None:
    assert grade_text_answer(None, ["x"]).reward == 0.0
    assert grade_text_answer("  ", ["x"]).reward == 0.0
    assert grade_text_answer("x", []).reward == 0.0


def test_unknown_metric_raises() -> None:
    with pytest.raises(ValueError, match="unknown text metric"):
        grade_text_answer("x", ["x"], metric="bleu")


def test_answers_that_normalize_to_nothing_never_match() -> None:
    assert exact_match("!", "+") == 0.0
    assert token_f1("the", "a") == 0.0
