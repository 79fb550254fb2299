"""Two GRPO steps end to end on the real CPU vLLM (marker `vllm`): `examples/train/demo.py`
builds the untied float32 model, starts vLLM in dev mode and `raas up`, trains two steps and
pushes each new version; every rollout's per-turn versions must be the version the trainer had
pushed when it was sampled, each push must pass the probe, and the trainer's logprobs of the
sampled tokens must match the stored ones (fp32 on both sides).

    VLLM_VENV=/path/to/vllm-venv SMOLLM_DIR=models/smollm2-135m-instruct \\
        .venv/bin/python -m pytest -m vllm tests/train/test_train_vllm.py
"""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
TRAIN_PY = REPO / ".venv-train" / "bin" / "python"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.timeout(1800)
def test_two_training_steps_record_the_pushed_versions(tmp_path: Path) -> None:
    if not TRAIN_PY.exists():
        pytest.fail("no .venv-train: run `make .venv-train/.installed` first")
    venv = Path(os.environ.get("VLLM_VENV", REPO / ".venv-vllm"))
    if not (venv / "bin" / "python").exists():
        pytest.fail(f"no vLLM venv at {venv}: set VLLM_VENV or run scripts/install_vllm_cpu.sh")
    out = tmp_path / "run"
    cmd = [
        str(TRAIN_PY),
        "examples/train/demo.py",
        "--out",
        str(out),
        "--vllm-port",
        str(free_port()),
        "--steps",
        "2",
        "--eval-every",
        "100",
        "--instances",
        "4",
        "--samples",
        "4",
        "--max-tokens",
        "64",
    ]
    if os.environ.get("SMOLLM_DIR"):
        cmd += ["--base-model", os.environ["SMOLLM_DIR"]]
    proc = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=1700, env={**os.environ, "VLLM_VENV": str(venv)}
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    steps = list(csv.DictReader((out / "steps.csv").open()))
    assert [r["step"] for r in steps] == ["0", "1", "2"]
    assert all(float(r["probe_gap"]) < 1e-3 for r in steps if r["probe_gap"])
    trained = [r for r in steps[1:] if r["logprob_gap"]]
    assert all(float(r["logprob_gap"]) < 1e-3 for r in trained)
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert {r["step"] for r in rollouts} == {1, 2}
    for r in rollouts:  # sync mode: sampled on exactly the version the trainer held then
        assert r["policy_versions"] == [r["trainer_version"]], r
        assert r["outcome"] == "completed" and r["generated_tokens"] > 0
    # step 2 sampled on what step 1 pushed (v1, or still v0 if no group of step 1 had signal)
    assert {r["trainer_version"] for r in rollouts if r["step"] == 2} == {f"v{steps[1]['version']}"}
    assert (out / "reward.png").stat().st_size > 1000
