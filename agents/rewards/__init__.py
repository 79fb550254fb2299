"""Reward functions shared by handlers: math answers and short text answers.

They are plain functions of (prediction, reference) so that they can be unit-tested on the
example sets without a sandbox or an LLM, and reused by any handler that grades the same way.
"""
from __future__ import annotations

from agents.rewards.math_answer import MathGrade, answer_from_run, extract_boxed, grade_math_answer
from agents.rewards.text_match import (
    TextGrade,
    exact_match,
    grade_text_answer,
    normalize_answer,
    token_f1,
)

__all__ = [
    "MathGrade",
    "TextGrade",
    "answer_from_run",
    "exact_match",
    "extract_boxed",
    "grade_math_answer",
    "grade_text_answer",
    "normalize_answer",
    "token_f1",
]
