"""Whose time ran out, end to end (issue 37): gateway, Celery workers, bwrap sandboxes, the LLM
simulator (a fake vLLM, named as such) and the trainer's `collect()`.

* The stall attack: a `math` policy that calls `python` with `time.sleep(4)` every turn under
  `tool_timeout: 5` until its RUN deadline. Its own tool calls used the time: `agent_error` /
  `deadline`, reward 0, failure class `policy`, and it counts in its group (no infra sample,
  the group not short) beside the control, a wrong `finish` answer (reward 0).
* A stalled inference server (a reply that takes longer than any 16-token reply could): the
  time ran out waiting on it, `timeout` / `deadline`, failure class `infra`, left out of its
  group (the group short).
* A paused pool: the rollout's request is in flight when the trainer pauses the pool and
  outlives the RUN deadline on the paused server. It asked for 1024 tokens, so without the
  pause the wait would count as its own generation (test_deadline_classes.py: a reply
  rambling to the deadline); held by a pausing server it is waiting: still `infra`.

The RUN deadlines are 15-30 s rather than the issue's 8 s: on a loaded 2-core machine (load
20-36 measured while this was written) a worker's first rollout spends several seconds before
its first turn (importing, loading the tokenizer), and that time is raas's, not the agent's:
with 8 s the stall attack was sometimes, correctly, `infra` (0 turns taken in 8 s once). The
reaper's grace is raised for the same reason (its `hung past its deadline` ending is a stalled
node: infra).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from fakellm.server import start_simulator
from bench.support.pipeline_harness import start_service, wait_for

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`

SMOLLM2 = str(Path(__file__).resolve().parents[1] / "fixtures" / "smollm2-tokenizer")
STALL, CONTROL, STALLED, PAUSED = "Stall until the deadline", "What is 3 + 4?", "Think hard", "Wait for the push"


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def math(instance_id: str, problem: str, answer: str = "7") -> dict:
    return {"instance_id": instance_id, "data": {"problem": problem, "answer": answer}}


SCRIPT = {
    "by_instance": {
        STALL: [call("python", code="import time; time.sleep(4)")],
        CONTROL: [call("finish", answer="8")],  # wrong: reward 0, trained on
        STALLED: [{"text": call("finish", answer="7"), "latency": 60}],
        PAUSED: [{"text": call("finish", answer="7"), "latency": 60}],
    }
}


@pytest.fixture(scope="module")
def service(tmp_path_factory, built_env):
    home = tmp_path_factory.mktemp("deadline-pipeline")
    (home / "envs").mkdir()
    (home / "envs" / "math").symlink_to(built_env("math", ["sympy", "numpy"]))
    svc = start_service(home, concurrency=3, extra={"stage_grace": 15.0})
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def sim():
    url, stop = start_simulator(SMOLLM2, SCRIPT)
    yield url
    stop()


def llm_spec(url: str | None) -> dict:
    spec: dict[str, Any] = {"tokenizer": SMOLLM2, "max_model_len": 4096}
    if url is not None:
        spec["servers"] = [{"url": url}]
    return spec


def test_the_stall_attack_is_the_policys_failure_and_counts_in_its_group(service, sim) -> None:
    client = service.client
    job = client.submit(
        "math",
        [math("stall", STALL), math("control", CONTROL)],
        n_samples=2,
        llm=llm_spec(sim),
        sampling={"max_tokens": 64},
        limits={"run_timeout": 30, "tool_timeout": 5, "max_turns": 20},
    )
    batch = client.collect(job.job_id, groups=2, timeout=300)
    assert len(batch.groups) == 2, service.log_tail()
    by_instance = {g.instance_id: g for g in batch.groups}
    stall, control = by_instance["stall"], by_instance["control"]
    seen = [(r.instance_id, r.outcome, r.error, r.metrics.get("time_split")) for g in batch.groups for r in g.rollouts]
    assert batch.n_infra == 0 and batch.short_groups == 0, seen
    assert len(stall.samples) == 2 and stall.rewards == [0.0, 0.0]
    for row in stall.rollouts:
        assert (row.outcome, row.finish_reason, row.failure_class) == ("agent_error", "deadline", "policy")
        assert row.reward == 0.0 and row.train_reward == 0.0
        split = row.metrics["time_split"]
        assert split["tools"] >= 15.0 and split["agent_share"] >= 0.5 and split["waiting"] < 1.0, seen
        assert row.metrics["turns"] >= 2 and sum(row.loss_mask) > 0  # it really acted, turn by turn
        assert "agent's own time" in (row.error or "")
    for row in control.rollouts:  # the control: a wrong answer, graded and trained on
        assert (row.outcome, row.reward, row.failure_class) == ("completed", 0.0, "none")


def test_a_stalled_inference_server_stays_infra(service, sim) -> None:
    client = service.client
    job = client.submit(
        "math",
        [math("stalled", STALLED)],
        n_samples=2,
        llm=llm_spec(sim),
        sampling={"max_tokens": 16},
        limits={"run_timeout": 15},
    )
    batch = client.collect(job.job_id, groups=1, timeout=240)
    [group] = batch.groups
    assert batch.n_infra == 2 and group.short and group.samples == [], service.log_tail()
    for row in group.rollouts:
        assert (row.outcome, row.finish_reason, row.failure_class) == ("timeout", "deadline", "infra")
        assert row.train_reward is None and row.attempt == 1
        split = row.metrics["time_split"]
        assert split["waiting"] >= 6.0 and split["agent_share"] < 0.5, split


def in_flight(url: str) -> int:
    stats = httpx.get(f"{url}/sim/stats").json()
    return stats.get("started", 0) - stats.get("requests", 0) - stats.get("aborted", 0)


def test_a_request_held_in_a_paused_pool_past_the_deadline_stays_infra(service) -> None:
    url, stop = start_simulator(SMOLLM2, SCRIPT)
    client = service.client
    server = client.add_llm_server(url, model=SMOLLM2, weight_version="v0")
    try:
        job = client.submit(
            "math",
            [math("paused", PAUSED)],
            llm=llm_spec(None),  # the caller's registered pool
            sampling={"max_tokens": 1024},  # 53 s at the expected rate: its own time, unpaused
            limits={"run_timeout": 15},
        )
        wait_for(lambda: in_flight(url) >= 1, 120, "the rollout's request in flight")
        paused = client.pause_pool(timeout=60)  # returns once the in-flight request has ended
        assert paused.servers[0].generating_at_pause == 1
        started = time.monotonic()
        done = service.wait_done(job.job_id, timeout=120)
        client.resume_pool("v1")
        assert time.monotonic() - started < 60
        [row] = service.all_results(job.job_id)
        view = client.rollout(row.rollout_id)
        assert done.outcomes == {"timeout": 1}, (view.error, view.metrics)
        assert (view.finish_reason, view.failure_class, view.attempt) == ("deadline", "infra", 1)
        split = view.metrics["time_split"]
        assert split["generation"] < 1.0 and split["waiting"] >= 6.0 and split["agent_share"] < 0.5, split
    finally:
        client.resume_pool()  # (a no-op when the test got that far)
        client.remove_llm_server(server.id)
        stop()
