"""The README's "Train with it" GRPO step stays short and in step with the SDK: at most 30
lines, valid Python, and every array it reads is one `Batch.to_arrays` returns (torch itself
is not installed here; the step's SDK half runs against the service in test_batches.py)."""

from __future__ import annotations

import ast
import re
from datetime import datetime, timezone
from pathlib import Path

from raas_client import Batch, Group, RaasClient, RolloutView

REPO = Path(__file__).resolve().parents[2]


def train_block() -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Train with it") :]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)[0]


def test_the_grpo_step_is_short_and_uses_what_the_sdk_gives():
    code = train_block()
    assert len(code.strip().splitlines()) <= 30
    ast.parse(code)
    row = RolloutView(
        rollout_id="r",
        job_id="j",
        instance_id="i",
        sample_index=0,
        status="done",
        outcome="completed",
        attempt=1,
        reward=1.0,
        prompt_ids=[1, 2],
        response_ids=[3, 4],
        response_logprobs=[-0.5, 0.0],
        loss_mask=[1, 0],
        policy_versions=["step-1"],
        extra={"turn_boundaries": [[0, 1]]},
        timing={},
        created_at=datetime.now(timezone.utc),
    )
    batch = Batch(groups=[Group(job_id="j", instance_id="i", rollouts=[row, row])])
    keys = set(batch.to_arrays(backend="numpy"))
    used = set(re.findall(r't\["(\w+)"\]', code))
    assert used and used <= keys
    for method in re.findall(r"raas\.(\w+)\(", code):
        assert hasattr(RaasClient, method), method
    for attribute in re.findall(r"batch\.(\w+)", code):
        assert attribute in Batch.model_fields or hasattr(Batch, attribute), attribute
