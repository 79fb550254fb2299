"""The README's GRPO step, verbatim, run with torch against the real service.

torch is not in the service's venv (and is not a dependency of anything here): the step runs
in an interpreter that has it (`RAAS_TORCH_PYTHON`, default the CPU vLLM venv's, `VLLM_VENV`) with
only `sdk/` on its path, against a gateway and Celery workers started by this test; the policy
is a stand-in (an embedding and a linear head, a real torch module) since no model is needed to
check the SDK's arrays feed a loss that back-propagates. Marked `sdk_torch`:
`make test-sdk-torch`.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.local_models import VLLM_VENV, torch_python
from tests.pipeline_harness import start_service
from tests.sdk.test_readme_train import train_block

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.service, pytest.mark.sdk_torch]  # whole-service tier
TORCH_PYTHON = torch_python(VLLM_VENV)  # the CPU vLLM's venv has torch

RUN = """
import json, torch
rows = [{"instance_id": f"i{k}"} for k in range(3)]
exec(compile(CODE, "README.md", "exec"))


class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(64, 8), torch.nn.Linear(8, 64)

    def forward(self, input_ids, attention_mask):
        return type("Out", (), {"logits": self.head(self.embed(input_ids))})()


torch.manual_seed(0)
policy = Policy()
before = policy.head.weight.detach().clone()
loss = grpo_step(policy, torch.optim.SGD(policy.parameters(), lr=0.5), pad_id=0)
print(json.dumps({"loss": loss, "moved": float((policy.head.weight - before).abs().sum())}))
"""


def test_the_readme_grpo_step_trains_on_real_groups(tmp_path):
    if not Path(TORCH_PYTHON).exists():
        pytest.fail(f"no interpreter with torch at {TORCH_PYTHON}: set RAAS_TORCH_PYTHON")
    code = train_block()
    for literal in ('"http://127.0.0.1:8000"', '"math"'):
        assert literal in code, f"the README's step no longer has {literal}"
    svc = start_service(tmp_path / "home", concurrency=2)
    try:
        code = code.replace('"http://127.0.0.1:8000"', repr(svc.url))
        code = code.replace('"math"', '"test-sleepy"')  # rewards 0/1 by sample parity
        env = {**os.environ, "PYTHONPATH": str(REPO / "sdk")}
        run = subprocess.run(
            [TORCH_PYTHON, "-c", f"CODE = {code!r}\n{RUN}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
    finally:
        svc.stop()
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert lines[0] == "3 groups (0 short), 0 infra failures left out, 0 stale dropped"
    result = json.loads(lines[-1])
    assert result["loss"] == result["loss"] and result["moved"] > 0  # finite; weights updated
