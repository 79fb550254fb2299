"""A RUN worker SIGKILLed while its turn-log batch is open (`tasks.writes.turn_log`): what resume
loses is exactly what the module says, the turn whose record had not committed, and nothing
is logged twice.

The batch window is stretched to 1.5 s so the kill surely lands inside one: turn 0 is
committed, turn 1 was generated and its tool ran, its record waits in the batch, and turn 2's
generation went out meanwhile (it overlaps the commit) while its tool call waits for turn 1 to
be durable. The reaper finds the lease dead and the RUN resumes in the same attempt from turn
1: turns 1 and 2 are generated again (two requests more than an uninterrupted rollout; only
turn 1's tool had run), every index is logged once, and the rollout ends with all its turns
(reward 1: the work was real).
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from fakellm.server import start_simulator
from core.db import session_scope
from core.models import Rollout, Turn
from bench.support.pipeline_harness import start_service

pytestmark = pytest.mark.service

REPO = Path(__file__).resolve().parents[1]
SMOLLM2 = str(REPO / "tests" / "fixtures" / "smollm2-tokenizer")
OBSERVE = '<tool_call>{"name": "observe", "arguments": {}}</tool_call>'
TURNS = 4


def _turns(db_url: str, rollout_id: str) -> list[tuple[int, int]]:
    with session_scope(db_url) as s:
        return [
            tuple(r)
            for r in s.execute(
                sa.select(Turn.attempt, Turn.index).where(Turn.rollout_id == rollout_id).order_by(Turn.id)
            )
        ]


def _requests(url: str) -> int:
    return httpx.get(f"{url}/sim/stats").json().get("requests", 0)


def test_a_worker_killed_mid_batch_loses_only_the_uncommitted_turn(tmp_path) -> None:
    url, stop_sim = start_simulator(SMOLLM2, {"default": [OBSERVE], "latency": 0.05})
    svc = start_service(tmp_path, concurrency=2, extra={"turn_batch_window": 1.5})
    try:
        job = svc.client.submit(
            "test-chat-resumable",
            [{"instance_id": "k", "turns": TURNS}],
            llm={"servers": [{"url": url}], "tokenizer": SMOLLM2, "max_model_len": 4096},
        )
        rid = job.rollout_ids[0]
        deadline = time.monotonic() + 60
        # Turn 0 committed, turn 1 generated (its tool ran): its record sits in the batch;
        # turn 2 generated, its tool call waiting for turn 1's commit.
        while not (_turns(svc.settings.db_url, rid) == [(1, 0)] and _requests(url) >= 3):
            assert time.monotonic() < deadline, svc.log_tail()
            time.sleep(0.02)
        assert _turns(svc.settings.db_url, rid) == [(1, 0)]  # still uncommitted at the kill
        svc.kill_worker("run", "node-a")
        svc.start_worker("run", "node-a", 2)
        svc.wait_done(job.job_id, timeout=90)
        view = svc.client.rollout(rid)
        assert view.outcome == "completed" and view.reward == 1.0, view.error
        assert _turns(svc.settings.db_url, rid) == [(1, k) for k in range(TURNS)]
        assert view.attempt == 1 and view.metrics["resumed_from_turn"] == 1
        # exactly the turn lost with the batch and the generation that overlapped it, again
        assert _requests(url) == TURNS + 2
        assert [t.observation for t in view.turns] == [f"k part {k + 1}." for k in range(TURNS - 1)] + [
            view.turns[-1].observation
        ]
        with session_scope(svc.settings.db_url) as s:
            [entry] = s.get(Rollout, rid).resumes
        assert entry["from_turn"] == 1
    finally:
        svc.stop()
        stop_sim()
