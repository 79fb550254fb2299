"""The SDK's pure parts: the failure-class table, version numbers, advantages, empty arrays."""
from __future__ import annotations

import pytest

from raas_client import advantages, failure_class_of
from raas_client.arrays import to_arrays
from raas_client.models import version_number


@pytest.mark.parametrize("outcome, expected", [
    ("completed", "none"), ("agent_error", "policy"), ("infra_error", "infra"),
    ("timeout", "infra"), ("cancelled", "infra"), ("prompt_too_long", "input"),
    ("something_new", "infra"), (None, None)])
def test_failure_class_table(outcome, expected):
    assert failure_class_of(outcome) == expected


@pytest.mark.parametrize("version, expected", [
    ("step-42", 42), ("7", 7), (3, 3), ("v2", 2), ("main", None), (None, None), (True, None)])
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
