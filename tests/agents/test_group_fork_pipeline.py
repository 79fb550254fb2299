"""A forked swe group earns the rewards of the same scripted episodes run unforked (issue 38).

Real service (gateway, Celery INIT/RUN/EVAL workers, reaper), real bwrap sandboxes, the LLM
simulator (a fake vLLM, named as such) scripted per instance: `intervals` is fixed (reward 1),
`slugify` is left alone (reward 0). One job forks its groups (the swe default: its INIT is
declared forkable), the other opts out (`sandbox.group_fork: false`, today's path).
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from core.db import session_scope
from core.models import GroupLayer, Rollout
from fakellm.server import start_simulator
from tests.agents.test_swe_pipeline import INTERVALS, SCRIPT, SLUGIFY, SMOLLM2, SWE, as_instance
from bench.support.pipeline_harness import start_service

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`
N = 3  # samples per instance


@pytest.fixture
def service(tmp_path, built_env):
    envs = tmp_path / "envs"
    envs.mkdir()
    (envs / "pytest").symlink_to(built_env("pytest", ["pytest"]))
    svc = start_service(tmp_path, concurrency=3)
    yield svc
    svc.stop()


@pytest.fixture
def llm():
    url, stop = start_simulator(SMOLLM2, SCRIPT)
    yield {"servers": [{"url": url}], "tokenizer": SMOLLM2, "max_model_len": 8192}
    stop()


def rewards(service, job_id: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in service.all_results(job_id):
        out.setdefault(r.instance_id, []).append(r.reward)
    return {k: sorted(v) for k, v in out.items()}


def test_forked_group_rewards_equal_the_unforked_ones(service, llm) -> None:
    instances = [as_instance(i, SWE) for i in (INTERVALS, SLUGIFY)]
    common = {"limits": {"max_turns": 4, "tool_timeout": 5}, "llm": llm, "n_samples": N}
    forked = service.client.submit("swe", instances, **common)
    plain = service.client.submit("swe", instances, sandbox={"group_fork": False}, **common)
    service.wait_done(forked.job_id, timeout=300)
    service.wait_done(plain.job_id, timeout=300)

    expected = {INTERVALS: [1.0] * N, SLUGIFY: [0.0] * N}
    assert rewards(service, plain.job_id) == expected, service.log_tail()
    assert rewards(service, forked.job_id) == expected, service.log_tail()
    fixed = [r for r in service.all_results(forked.job_id) if r.instance_id == INTERVALS]
    for r in fixed:  # each sample's artifact is its own diff against the base commit
        patch = service.client.rollout(r.rollout_id).extra["git_patch"]
        assert "max(merged[-1][1], end)" in patch and patch.count("diff --git") == 1

    db = service.settings.db_url
    with session_scope(db) as s:
        layers = s.execute(select(GroupLayer).where(GroupLayer.job_id == forked.job_id)).scalars().all()
        assert sorted(x.instance_id for x in layers) == [INTERVALS, SLUGIFY]  # one per group
        seen = [(x.status, x.mode, x.prepared_seconds, x.error) for x in layers]
        assert all(x.mode == "overlay" and x.prepared_seconds > 0 for x in layers), seen
        assert not s.execute(select(GroupLayer).where(GroupLayer.job_id == plain.job_id)).first()
        rows = s.execute(select(Rollout.sandbox).where(Rollout.job_id == forked.job_id)).all()
        assert rows
    # the samples took fork slots the INIT processes' pools started while the layer was made
    starts = [r.metrics["sandbox_start"] for r in service.all_results(forked.job_id)]
    # (a layer made faster than the slots start, on a loaded node, leaves some forks cold)
    assert sum(x["kind"] == "fork slot" for x in starts) >= 1, starts
    assert all(x["kind"] in ("fork slot", "fork") and x["ms"] >= 0 for x in starts), starts
    assert {x["kind"] for x in (r.metrics["sandbox_start"] for r in service.all_results(plain.job_id))} <= {
        "warm",
        "cold",
    }
    # the reaper removes each layer once its group is past RUN; nothing of it stays on disk
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with session_scope(db) as s:
            statuses = {x.status for x in s.execute(select(GroupLayer)).scalars()}
        if statuses == {"removed"}:
            break
        time.sleep(0.5)
    assert statuses == {"removed"}
    root = service.settings.workspaces
    assert not list((root / "layers").iterdir()) if (root / "layers").exists() else True
    assert not [p for p in root.iterdir() if p.name.endswith("-fork")]
