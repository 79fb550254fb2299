"""The `plain_answer` handler's parts and the arithmetic set (no service: fast)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from agents.handlers.plain_answer.handler import PlainAnswerConfig, last_number
from agents.registry import get_handler
from core.errors import InvalidRequest

REPO = Path(__file__).resolve().parents[2]


def _build_module():
    spec = importlib.util.spec_from_file_location("build_arith", REPO / "examples/arith/build_arith.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "text, number",
    [
        ("3 + 5 = 8", "8"),
        ("The answer is 12.", "12"),
        ("It is 1,024", "1024"),
        ("7-2", "2"),
        ("is -3.", "-3"),
        ("3/4 of it", "3/4"),
        ("2.50.", "2.50"),
        ("none", None),
        ("1,2,3", "3"),
    ],
)
def test_last_number(text: str, number: str | None) -> None:
    assert last_number(text) == number


def test_handler_needs_no_sandbox_and_validates_instances() -> None:
    handler = get_handler("plain_answer")
    assert handler.sandbox_needed(PlainAnswerConfig()) is False
    handler.validate_instance({"question": "What is 2 + 2?", "answer": 4})
    for bad, field in [
        ({"answer": "4"}, "instance.question"),
        ({"question": "q", "answer": "four"}, "instance.answer"),
        ({"question": "q", "answer": True}, "instance.answer"),
    ]:
        with pytest.raises(InvalidRequest) as err:
            handler.validate_instance(bad)
        assert err.value.details["field"] == field


def test_math_needs_a_sandbox_only_for_its_tools() -> None:
    math = get_handler("math")
    assert math.sandbox_needed(math.Config(tools=[])) is False
    assert math.sandbox_needed(math.Config()) is True


def test_arith_split_is_seeded_disjoint_and_matches_the_files() -> None:
    build = _build_module()
    rows = build.all_problems()
    train, heldout = build.split(rows, 40, seed=0)
    assert len(rows) == 200 and len(heldout) == 40 and len(train) == 160
    assert not {r["instance_id"] for r in train} & {r["instance_id"] for r in heldout}
    assert build.split(rows, 40, seed=1) != (train, heldout)
    for name, split in (("train", train), ("heldout", heldout)):
        shipped = [json.loads(line) for line in (REPO / f"examples/arith/{name}.jsonl").read_text().splitlines()]
        assert shipped == split
    assert {"question": "What is 7 * 8?", "answer": "56"}.items() <= next(
        r for r in rows if r["instance_id"] == "arith-mul-7-8"
    ).items()
