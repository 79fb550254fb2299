"""Short-answer rewards: normalized exact match and token-level F1 against gold aliases.

Normalization follows the usual QA convention (lower case, no punctuation, no English articles,
collapsed whitespace) so `"The json module."` matches `json`. Punctuation inside identifiers
matters for code-ish answers (`os.path.join`, `__init__`), so underscores and dots between word
characters are kept and only stray punctuation is dropped.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_INNER_DOT = re.compile(r"(?<=\w)\.(?=\w)")
_PUNCT = str.maketrans({c: " " for c in string.punctuation if c != "_"})
_PLACEHOLDER = "\u0000"


@dataclass
class TextGrade:
    """Both scores against the best-matching alias, and the one used as the reward."""

    reward: float
    exact_match: float
    f1: float
    best_alias: str | None = None


def normalize_answer(text: str) -> str:
    """Lower case, drop articles and stray punctuation (keeping `a.b` and `_`), squeeze spaces."""
    text = text.lower()
    text = _INNER_DOT.sub(_PLACEHOLDER, text)
    text = text.translate(_PUNCT).replace(_PLACEHOLDER, ".")
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 if the normalized strings are equal (and not empty), else 0.0."""
    pred = normalize_answer(prediction)
    return float(bool(pred) and pred == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """Harmonic mean of token precision and recall after normalization."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:  # an all-punctuation answer matches nothing
        return 0.0
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(pred_tokens)
    recall = common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def grade_text_answer(prediction: str | None, golds: Sequence[str], *, metric: str = "f1") -> TextGrade:
    """Score `prediction` against every alias in `golds`; the reward is `metric` of the best."""
    if metric not in ("f1", "exact_match"):
        raise ValueError(f"unknown text metric {metric!r}; use 'f1' or 'exact_match'")
    if prediction is None or not prediction.strip() or not golds:
        return TextGrade(0.0, 0.0, 0.0, None)
    scored = [(exact_match(prediction, g), token_f1(prediction, g), g) for g in golds]
    rank = (lambda s: (s[0], s[1])) if metric == "exact_match" else (lambda s: (s[1], s[0]))
    em, f1, alias = max(scored, key=rank)
    return TextGrade(em if metric == "exact_match" else f1, em, f1, alias)
