"""Drain on the signals a cluster sends, end to end: real gateway, Celery worker processes,
bwrap sandboxes, the reaper, the LLM simulator (a fake vLLM, named as such).

- `--signal=B:TERM@N` (or a preemption's grace period): the RUN pool gets SIGTERM while a turn
  is being generated. The turn in flight finishes and is logged, the loop stops at the turn
  boundary, and the rollout is handed back as a new attempt whose RUN replays the logged turns
  into a rebuilt sandbox: not one turn is generated twice.
- A plain `scancel` (SIGTERM to every process of the job, the sandboxes included): the turn in
  flight loses its sandbox, the new attempt replays the logged turns, and at most that turn
  is generated again.
"""

from __future__ import annotations

import os
import signal

import pytest

from fakellm.server import start_simulator
from tests.agents.test_replay_pipeline import (
    ARRAYS,
    KEPT,
    SCRIPT,
    SMOLLM2,
    _row,
    _stats,
    _submit,
    _turns,
)
from bench.support.pipeline_harness import start_service, wait_for
from raas_client.models import RolloutView

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`


@pytest.fixture(scope="module")
def service(tmp_path_factory, built_env):
    home = tmp_path_factory.mktemp("drain-replay")
    (home / "envs").mkdir()
    (home / "envs" / "math").symlink_to(built_env("math", ["sympy", "numpy"]))
    # a 6 s drain: too short for two more turns as long as the 4 s one in flight
    svc = start_service(home, concurrency=2, extra={"soft_shutdown_timeout": 6})
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def llm():
    url, stop = start_simulator(SMOLLM2, SCRIPT)
    yield {"servers": [{"url": url}], "tokenizer": SMOLLM2, "max_model_len": 4096}
    stop()


@pytest.fixture(scope="module")
def plain(service, llm) -> RolloutView:
    """The uninterrupted episode: what every interrupted one must equal."""
    job, rid = _submit(service, llm, KEPT)
    service.wait_done(job, timeout=120)
    view = service.client.rollout(rid)
    assert view.outcome == "completed" and view.reward == 1.0, view.error
    return view


def _terminate_mid_turn(service, rid: str, sandbox_too: bool) -> None:
    """SIGTERM the RUN pool (and the rollout's sandbox) once 2 turns are logged, while the
    third is being generated; start the pool again once it exited (the next node job)."""
    wait_for(lambda: len(_turns(service, rid)) >= 2, timeout=60, what="2 turns logged", interval=0.05)
    handle = _row(service, rid).sandbox
    pool = service.workers[("run", "node-a")]
    pool.send_signal(signal.SIGTERM)
    if sandbox_too:
        for key in ("init_pid", "pid"):
            try:
                os.kill(int(handle[key]), signal.SIGTERM)
            except (ProcessLookupError, KeyError, TypeError):
                pass
    assert pool.wait(60) == 0  # drained, not killed
    service.workers.pop(("run", "node-a"))
    service.start_worker("run", "node-a", 2)


def _per_turn(before: dict, after: dict) -> list[int]:
    return [after.get(f"turn:{KEPT}:{t}", 0) - before.get(f"turn:{KEPT}:{t}", 0) for t in range(4)]


def test_a_drained_run_stops_at_the_turn_boundary_and_nothing_is_generated_twice(service, llm, plain) -> None:
    before = _stats(llm)
    job, rid = _submit(service, llm, KEPT)
    _terminate_mid_turn(service, rid, sandbox_too=False)
    service.wait_done(job, timeout=120)
    view = service.client.rollout(rid)
    for name in ARRAYS:
        assert getattr(view, name) == getattr(plain, name), name
    assert view.attempt == 2 and "drains" in view.earlier_attempts[0].error
    assert [t.index for t in view.earlier_attempts[0].turns] == [0, 1, 2]  # the turn in flight finished
    assert view.metrics["replayed_turns"] == 3
    after = _stats(llm)
    assert _per_turn(before, after) == [1, 1, 1, 1]  # every turn generated once
    assert after.get("started", 0) - before.get("started", 0) == 4


def test_a_plain_term_to_every_process_replays_and_regenerates_at_most_the_turn_in_flight(service, llm, plain) -> None:
    before = _stats(llm)
    job, rid = _submit(service, llm, KEPT)
    _terminate_mid_turn(service, rid, sandbox_too=True)
    service.wait_done(job, timeout=120)
    view = service.client.rollout(rid)
    for name in ARRAYS:
        assert getattr(view, name) == getattr(plain, name), name
    assert view.attempt == 2 and view.metrics["replayed_turns"] >= 2
    after = _stats(llm)
    assert _per_turn(before, after)[:2] == [1, 1]  # the logged turns were never generated again
    assert after.get("started", 0) - before.get("started", 0) <= 5  # at most the turn in flight twice
