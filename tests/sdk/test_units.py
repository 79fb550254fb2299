"""The SDK's pure parts: the failure-class table, version numbers, advantages, empty arrays."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from raas_client import Group, RolloutView, advantages, failure_class_of
from raas_client.arrays import to_arrays
from raas_client.models import version_number


@pytest.mark.parametrize(
    "outcome, expected",
    [
        ("completed", "none"),
        ("agent_error", "policy"),
        ("infra_error", "infra"),
        ("timeout", "infra"),
        ("cancelled", "infra"),
        ("prompt_too_long", "input"),
        ("something_new", "infra"),
        (None, None),
    ],
)
def test_failure_class_table(outcome, expected):
    assert failure_class_of(outcome) == expected


@pytest.mark.parametrize(
    "version, expected", [("step-42", 42), ("7", 7), (3, 3), ("v2", 2), ("main", None), (None, None), (True, None)]
)
def test_version_numbers(version, expected):
    assert version_number(version) == expected


def test_advantages():
    assert advantages([1.0]) == [0.0] and advantages([1.0], "rloo") == [0.0]
    assert advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]  # no variance, no signal
    assert advantages([1.0, 0.0], "rloo") == [1.0, -1.0]
    with pytest.raises(ValueError, match="grpo or rloo"):
        advantages([1.0, 0.0], "ppo")


def test_arrays_of_nothing_keep_their_rank():
    arrays = to_arrays([], backend="numpy")
    assert arrays["input_ids"].shape == (0, 0) and arrays["rewards"].shape == (0,)


def row(k: int, **fields) -> RolloutView:
    base = {
        "rollout_id": f"r{k}",
        "job_id": "j",
        "instance_id": "i",
        "sample_index": k,
        "status": "done",
        "outcome": "completed",
        "attempt": 1,
        "reward": float(k % 2),
        "timing": {},
        "created_at": datetime.now(timezone.utc),
    }
    return RolloutView(**{**base, **fields})


def test_a_straggler_cut_is_neither_a_sample_nor_a_failure():
    cut = row(3, outcome="cancelled", reward=None, cut_reason="spare")
    group = Group(job_id="j", instance_id="i", rollouts=[row(0), row(1), row(2), cut], expected=3)
    assert group.samples == group.rollouts[:3] and group.cut == [cut]
    assert not group.short and group.n_infra == 0
    failed = row(2, outcome="infra_error", reward=None)
    short = Group(job_id="j", instance_id="i", rollouts=[row(0), row(1), failed, cut], expected=3)
    assert short.short and short.n_infra == 1 and len(short.samples) == 2


def test_every_client_method_answers_with_a_typed_model() -> None:
    """No public `RaasClient` method returns a dict (or Any): each answer is a wire model, a
    list or iterator of them, a string or None."""
    import inspect
    import typing

    from pydantic import BaseModel

    from raas_client import RaasClient

    def untyped(hint: object) -> bool:
        if hint is typing.Any or hint is dict or typing.get_origin(hint) is dict:
            return True
        return any(untyped(arg) for arg in typing.get_args(hint))

    methods = [m for name, m in inspect.getmembers(RaasClient, inspect.isfunction) if not name.startswith("_")]
    hints = {m.__name__: typing.get_type_hints(m)["return"] for m in methods}
    assert len(hints) >= 25 and not [name for name, hint in hints.items() if untyped(hint)]
    assert issubclass(hints["job"], BaseModel) and issubclass(hints["submit"], BaseModel)
