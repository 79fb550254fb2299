"""A lost sandbox is rebuilt and replayed, end to end: real gateway, Celery worker processes,
bwrap sandboxes, the reaper, the LLM simulator (a fake vLLM, named as such).

What node loss (or `scancel`) does to a rollout mid-RUN is done by hand: the RUN worker and the
rollout's sandbox processes are SIGKILLed while a turn is being generated. The reaper sees the
lease stop beating and the sandbox gone, and gives the rollout a new attempt from INIT; its RUN
replays the logged tool calls into the fresh sandbox and goes on from the last logged turn.

- A deterministic episode (`math`, a value kept in the sandbox's Python session) ends with the
  token arrays and reward of an uninterrupted run, the value rebuilt by replay, and only the
  turn in flight generated twice (counted at the simulator).
- A tool that prints the time diverges on replay: recorded, and the job's
  `resume.on_divergence` is what happens (continue in attempt 2, or restart from INIT).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from core.db import session_scope
from core.models import Rollout, Turn
from fakellm.server import start_simulator
from tests.agents.test_resume_pipeline import ARRAYS
from bench.support.pipeline_harness import start_service

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = str(REPO / "tests" / "fixtures" / "smollm2-tokenizer")
KEPT = "Compute 20 + 1, then double it (replayed)."
CLOCK = "What time is it? Then answer 7."


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


# The turn after the second takes 4 s to "generate": the node is lost in the middle of it.
SCRIPT = {
    "by_instance": {
        KEPT: [
            call("python", code="x = 20"),
            call("python", code="x += 1"),
            {"text": call("python", code="print(x * 2)"), "latency": 4},
            call("finish", answer="42"),
        ],
        CLOCK: [
            call("python", code="import time; print(time.time_ns())"),
            call("python", code="print(3 + 4)"),
            {"text": call("python", code="print('ok')"), "latency": 4},
            call("finish", answer="7"),
        ],
    }
}
ANSWERS = {KEPT: "42", CLOCK: "7"}


@pytest.fixture(scope="module")
def service(tmp_path_factory, built_env):
    home = tmp_path_factory.mktemp("replay-pipeline")
    (home / "envs").mkdir()
    (home / "envs" / "math").symlink_to(built_env("math", ["sympy", "numpy"]))
    svc = start_service(home, concurrency=2)
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def llm():
    url, stop = start_simulator(SMOLLM2, SCRIPT)
    yield {"servers": [{"url": url}], "tokenizer": SMOLLM2, "max_model_len": 4096}
    stop()


def _stats(llm: dict) -> dict[str, int]:
    return httpx.get(f"{llm['servers'][0]['url']}/sim/stats").json()


def _submit(service, llm, problem: str, **job: Any) -> tuple[str, str]:
    accepted = service.client.submit(
        "math",
        [{"instance_id": "p", "data": {"problem": problem, "answer": ANSWERS[problem]}}],
        limits={"max_turns": 6},
        llm=llm,
        **job,
    )
    return accepted.job_id, accepted.rollout_ids[0]


def _turns(service, rollout_id: str) -> list[tuple[int, int]]:
    with session_scope(service.settings.db_url) as s:
        rows = s.execute(sa.select(Turn.attempt, Turn.index).where(Turn.rollout_id == rollout_id).order_by(Turn.id))
        return [tuple(r) for r in rows]


def _row(service, rollout_id: str) -> Rollout:
    with session_scope(service.settings.db_url) as s:
        row = s.get(Rollout, rollout_id)
        s.expunge(row)
        return row


def lose_node_mid_turn(service, rollout_id: str, logged: int = 2) -> None:
    """Once `logged` turns are stored: SIGKILL the RUN pool and the rollout's sandbox (bwrap
    and the init inside it), as a lost node or `scancel` does; the pool comes back empty."""
    deadline = time.monotonic() + 60
    while len(_turns(service, rollout_id)) < logged:
        assert time.monotonic() < deadline, service.log_tail()
        time.sleep(0.05)
    handle = _row(service, rollout_id).sandbox
    service.kill_worker("run", "node-a")
    for key in ("init_pid", "pid"):
        try:
            os.kill(int(handle[key]), signal.SIGKILL)
        except (ProcessLookupError, KeyError, TypeError):
            pass
    service.start_worker("run", "node-a", 2)


def test_a_lost_sandbox_is_rebuilt_by_replay_and_generates_only_the_turn_in_flight(service, llm) -> None:
    before = _stats(llm)
    job, plain_id = _submit(service, llm, KEPT)
    service.wait_done(job, timeout=120)
    plain = service.client.rollout(plain_id)
    assert plain.outcome == "completed" and plain.reward == 1.0, plain.error
    assert _stats(llm).get("started", 0) - before.get("started", 0) == 4

    before = _stats(llm)
    job, rid = _submit(service, llm, KEPT)
    lose_node_mid_turn(service, rid)
    service.wait_done(job, timeout=120)
    replayed = service.client.rollout(rid)

    for name in ARRAYS:  # the reward too: the same episode as the uninterrupted one
        assert getattr(replayed, name) == getattr(plain, name), name
    assert replayed.attempt == 2 and len(replayed.earlier_attempts) == 1  # INIT ran again
    assert "stopped beating" in replayed.earlier_attempts[0].error
    assert _turns(service, rid) == [(1, 0), (1, 1), (2, 0), (2, 1), (2, 2), (2, 3)]
    assert replayed.turns[2].observation.strip() == "42"  # x was rebuilt by the replay
    assert replayed.metrics["replayed_turns"] == 2 and replayed.metrics["replay_divergences"] == []
    answered = _stats(llm)
    per_turn = [answered.get(f"turn:{KEPT}:{t}", 0) - before.get(f"turn:{KEPT}:{t}", 0) for t in range(4)]
    assert per_turn[:2] == [1, 1]  # the logged turns were never generated again
    assert answered.get("started", 0) - before.get("started", 0) <= 5  # 4 turns + at most the one in flight


@pytest.mark.parametrize("choice", ["continue", "restart"])
def test_a_tool_that_prints_the_time_diverges_and_the_job_chooses(service, llm, choice) -> None:
    before = _stats(llm)
    job, rid = _submit(service, llm, CLOCK, resume={"on_divergence": choice})
    lose_node_mid_turn(service, rid)
    service.wait_done(job, timeout=180)
    view = service.client.rollout(rid)
    assert (view.outcome, view.reward) == ("completed", 1.0), view.error
    history = _row(service, rid).attempt_history
    answered = _stats(llm)
    first = answered.get(f"turn:{CLOCK}:0", 0) - before.get(f"turn:{CLOCK}:0", 0)
    if choice == "continue":  # attempt 2 goes on, the divergence on record, observations logged
        assert view.attempt == 2
        [divergence] = view.metrics["replay_divergences"]
        assert (divergence["turn"], divergence["tool"]) == (0, "python")
        assert divergence["replayed"] != divergence["logged"]
        assert view.turns[0].observation == view.earlier_attempts[0].turns[0].observation
        assert view.metrics["replayed_turns"] == 2 and first == 1
    else:  # attempt 2 stopped at the divergence; attempt 3 started over from INIT
        assert view.attempt == 3 and "replayed_turns" not in view.metrics
        assert history[1]["replay"] is False and "diverged" in history[1]["error"]
        assert history[1]["replay_divergences"][0]["tool"] == "python"
        assert [t.index for t in view.turns] == [0, 1, 2, 3] and first == 2


def test_a_job_that_turns_replay_off_restarts_from_init_as_before(service, llm) -> None:
    before = _stats(llm)
    job, rid = _submit(service, llm, KEPT, resume={"replay": False})
    lose_node_mid_turn(service, rid)
    service.wait_done(job, timeout=120)
    view = service.client.rollout(rid)
    assert (view.outcome, view.reward, view.attempt) == ("completed", 1.0, 2), view.error
    assert "replayed_turns" not in view.metrics
    first = _stats(llm).get(f"turn:{KEPT}:0", 0) - before.get(f"turn:{KEPT}:0", 0)
    assert first == 2  # every turn generated again


def test_the_resume_spec_is_validated_at_submission(service, llm) -> None:
    from raas_client import RaasHTTPError

    with pytest.raises(RaasHTTPError) as bad:
        _submit(service, llm, KEPT, resume={"on_divergence": "maybe"})
    assert "resume.on_divergence" in str(bad.value)
    with pytest.raises(RaasHTTPError) as unknown:
        _submit(service, llm, KEPT, resume={"replays": True})
    assert "resume.replays" in str(unknown.value)
