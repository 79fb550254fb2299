"""A PostgreSQL restart shorter than the lease costs the in-flight rollouts nothing.

Scripted `math` rollouts (LLM simulator, real bwrap sandboxes, a Python tool call per turn)
are mid-RUN when a private PostgreSQL is stopped (`fast`: every client connection dropped),
kept down for 3 s and started again. Stage writes retry on connection errors for up to the
lease (`tasks.db_retry`), heartbeats resume, and the reaper finds no lost lease: every rollout
ends in its first attempt with no resume, its turns logged once each, and the simulator
answered exactly the turns in the trajectories (nothing generated twice).
"""
from __future__ import annotations

import json
import time
from typing import Any

import httpx
import sqlalchemy as sa

from agents.llm.simulator import start_simulator
from core.db import session_scope
from core.models import Rollout, Turn
from tests.conftest import REDIS_URL
from tests.pipeline_harness import REPO, start_service, wait_for
from tests.private_services import make_private_postgres, private_postgres  # noqa: F401

SMOLLM2 = str(REPO / "tests" / "fixtures" / "smollm2-tokenizer")
ROLLOUTS, TURNS = 6, 4


def call(name: str, **arguments: Any) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


SCRIPT = {"default": [{"text": call("python", code=f"print({k})"), "latency": 0.8}
                      for k in range(TURNS - 1)] + [call("finish", answer="7")]}


def test_postgres_restart_mid_run_reruns_nothing(tmp_path, private_postgres, redis_prefix):
    db_url = private_postgres.create_database("raas")
    url, stop_sim = start_simulator(SMOLLM2, SCRIPT)
    svc = start_service(tmp_path, db_url=db_url, broker_url=REDIS_URL, key_prefix=redis_prefix,
                        concurrency={"init": 2, "run": ROLLOUTS, "eval": 2},
                        extra={"lease_timeout": 10.0})
    try:
        job = svc.client.submit(
            "math", [{"instance_id": f"p{k}", "data": {"problem": f"What is {k} + 7 - {k}?",
                                                          "answer": "7"}}
                     for k in range(ROLLOUTS)],
            agent_config={"python_env": None}, limits={"max_turns": 6},
            llm={"servers": [{"url": url}], "tokenizer": SMOLLM2, "max_model_len": 4096})

        def running() -> bool:
            with session_scope(db_url) as s:
                return s.scalar(sa.select(sa.func.count()).select_from(Rollout).where(
                    Rollout.status == "run", Rollout.lease_owner.is_not(None))) >= 3

        wait_for(running, timeout=90, what="rollouts mid-RUN")
        private_postgres.restart("fast", downtime=3.0)
        done = svc.wait_done(job["job_id"], timeout=120)
        assert done["outcomes"] == {"completed": ROLLOUTS}, svc.log_tail()
        with session_scope(db_url) as s:
            rows = s.scalars(sa.select(Rollout).where(Rollout.job_id == job["job_id"])).all()
            turns = s.execute(sa.select(Turn.rollout_id, Turn.attempt, Turn.index)).all()
        assert [(r.attempt, r.resumes, r.reward) for r in rows] == [(1, None, 1.0)] * ROLLOUTS
        assert sorted(turns) == sorted((r.id, 1, i) for r in rows for i in range(TURNS))
        assert all(len(r.response_ids) > 0 for r in rows)
        stats = httpx.get(f"{url}/sim/stats").json()
        assert stats["started"] == stats["requests"] == ROLLOUTS * TURNS  # nothing generated twice
    finally:
        svc.stop()
        stop_sim()
