"""Every example SWE instance is solvable and gradable through the handler's real EVAL.

For each instance in examples/swe/instances.jsonl, in a real bwrap sandbox with the pytest
environment: the repo at its base commit gets reward 0 (FAIL_TO_PASS fail, PASS_TO_PASS pass),
and the reference fix, applied in the sandbox as an agent would, gets reward 1 — graded as the
pipeline does (RUN's sandbox killed, the artifact graded in a fresh sandbox).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents.handlers.swe.handler import SWEConfig, SWEHandler
from agents.handlers.swe.repo import example_instances

REPO = Path(__file__).resolve().parents[2]
INSTANCES_FILE = REPO / "examples" / "swe" / "instances.jsonl"
INSTANCES = [json.loads(line) for line in INSTANCES_FILE.read_text().splitlines() if line]


@pytest.fixture(scope="module")
def pytest_env(built_env) -> str:
    return built_env("pytest", ["pytest"])


def prepared(make_ctx, make_sandbox, tmp_path: Path, instance: dict[str, Any], env: str, **config: Any):
    """INIT through the handler into a fresh workspace, with a sandbox on it (an EVAL ctx)."""
    handler = SWEHandler()
    workspace = tmp_path / f"ws-{instance['instance_id']}"
    workspace.mkdir(parents=True)
    ctx = make_ctx(stage="init", instance=instance, workspace=str(workspace), agent_config=SWEConfig(**config))
    handler.init(ctx)
    return handler, make_ctx(stage="run", after=ctx, sandbox=make_sandbox(str(workspace), python_env=env))


def agent_applies(ctx, patch: str) -> None:
    """What an agent would do with bash: apply a diff in the repo."""
    ctx.sandbox.write_file(f"{ctx.workspace}/fix.diff", patch)
    result = ctx.sandbox.bash("git apply fix.diff && rm fix.diff", timeout=30)
    assert result.exit_code == 0, result.output


def test_instances_file_is_up_to_date_and_well_formed() -> None:
    assert len(INSTANCES) >= 6
    assert INSTANCES == example_instances(REPO / "examples" / "swe")
    for instance in INSTANCES:
        SWEHandler().validate_instance(instance)
        assert instance["FAIL_TO_PASS"] and instance["PASS_TO_PASS"]


@pytest.mark.parametrize("instance", INSTANCES, ids=[i["instance_id"] for i in INSTANCES])
def test_unpatched_repo_fails_and_reference_fix_passes(
    instance, make_ctx, make_sandbox, grade_artifact, tmp_path, pytest_env
) -> None:
    handler, ctx = prepared(make_ctx, make_sandbox, tmp_path / "base", instance, pytest_env)
    base = grade_artifact(handler, ctx, {"python_env": pytest_env})
    assert base.reward == 0.0
    assert base.metrics["f2p_passed"] == 0
    assert base.metrics["p2p_passed"] == base.metrics["p2p_total"] == len(instance["PASS_TO_PASS"])
    assert base.extra["git_patch"] == ""

    handler, ctx = prepared(make_ctx, make_sandbox, tmp_path / "fix", instance, pytest_env)
    agent_applies(ctx, instance["patch"])
    fixed = grade_artifact(handler, ctx, {"python_env": pytest_env})
    assert fixed.reward == 1.0, fixed.extra.get("test_output")
    assert fixed.metrics["f2p_passed"] == len(instance["FAIL_TO_PASS"])
    assert set(fixed.extra["test_results"].values()) == {"passed"}
    changed = [line for line in instance["patch"].splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert all(line in fixed.extra["git_patch"] for line in changed)
