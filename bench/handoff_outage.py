"""Broker outage during hand-offs: rollouts re-run (and turns re-generated) by a 3 s Redis restart.

A 42-rollout job of `test-sandboxed` (a real bwrap sandbox per rollout; INIT 0.5 s, RUN 1 s in
2 turns, EVAL at once) runs on a private Redis (bench/support/private_services.py) + a fresh
PostgreSQL database, one node with 4 slots per stage and its reaper. Once the first rollouts
finish, Redis is stopped, stays down `--downtime` seconds and starts again (without and with
AOF), so hand-offs (INIT->RUN, RUN->EVAL) meet the outage. Counted from the database at the
end: rollouts whose final attempt is above 1 (re-run from INIT), split by the reason of the
earlier attempt's end (`worker lost`: its worker stopped beating, i.e. the worker process died
or hung; `hand-off`: anything else, e.g. RUN finding its sandbox released), RUN resumes, turns
logged beyond the 2 a rollout needs, failures, and the wall time. Worker pools that exit during
the run are restarted (what a supervisor does) and counted: a Celery consumer can die on an
ack during the outage (issue 15 item 7), which is not the hand-off's doing.

The baseline is the code tree given by `--baseline` (e.g. a checkout of main before the
change), run by the same script in the same invocation; "new" is this tree.

Usage: .venv/bin/python bench/handoff_outage.py --baseline /path/to/old/tree [--runs 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
N_ROLLOUTS, TURNS = 42, 2


def measure(aof: bool, downtime: float) -> dict:
    """One job through one Redis restart, in the tree on sys.path (a child process)."""
    import sqlalchemy as sa

    from core.db import session_scope
    from core.models import Rollout, Turn
    from bench.support.pipeline_harness import start_service, wait_for
    from bench.support.private_services import PrivateRedis

    db = f"raas_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{db}"'))
    redis = PrivateRedis(aof=aof)
    redis.start()
    home = Path(tempfile.mkdtemp(prefix="raas-bench-handoff-"))
    svc = start_service(
        home,
        db_url=sa.engine.make_url(PG_ADMIN).set(database=db).render_as_string(hide_password=False),
        broker_url=redis.url,
        extra={"outbox_grace": 2.0, "sandbox_dir": str(home / "sandboxes")},
    )
    try:
        started = time.monotonic()
        job = svc.client.submit(
            "test-sandboxed",
            [{"instance_id": f"i{k}"} for k in range(N_ROLLOUTS)],
            agent_config={"init_s": 0.5, "run_s": 1.0, "turns": TURNS},
        )
        wait_for(lambda: svc.client.job(job.job_id).finished >= 4, 120, "the first rollouts to finish")
        at = svc.client.job(job.job_id).finished
        redis.restart(downtime=downtime)
        exits = 0
        while svc.client.job(job.job_id).finished < N_ROLLOUTS:
            if time.monotonic() - started > 400:
                raise AssertionError(f"job not done: {svc.log_tail()}")
            for (stage, node), proc in list(svc.workers.items()):
                if proc.poll() is not None:  # a supervisor restarts a pool that exited
                    exits += 1
                    svc.start_worker(stage, node)
            time.sleep(0.2)
        wall = time.monotonic() - started
        with session_scope(svc.settings.db_url) as s:
            rows = s.execute(
                sa.select(
                    Rollout.attempt,
                    Rollout.status,
                    Rollout.attempt_history,
                    *([Rollout.resumes] if hasattr(Rollout, "resumes") else []),
                ).where(Rollout.job_id == job.job_id)
            ).all()
            turns = s.scalar(sa.select(sa.func.count()).select_from(Turn))
        lost = sum(any("stopped beating" in (h.get("error") or "") for h in r.attempt_history or []) for r in rows)
        logs = "".join(p.read_text(errors="replace") for p in svc.logs.glob("*.log"))
        return {
            "aof": aof,
            "downtime_s": downtime,
            "finished_before_outage": at,
            "rollouts": len(rows),
            "rerun": sum(r.attempt > 1 for r in rows),
            "rerun_worker_lost": lost,
            "rerun_hand_off": sum(r.attempt > 1 for r in rows) - lost,
            "worker_exits": exits,
            "resumed": sum(bool(getattr(r, "resumes", None)) for r in rows),
            "extra_turns": turns - TURNS * len(rows),
            "failed": sum(r.status != "done" for r in rows),
            "false_failure_logs": logs.count("ends rollout: failed"),
            "deferred_to_outbox": logs.count("publish deferred to the outbox"),
            "wall_s": round(wall, 1),
        }
    finally:
        svc.stop()
        redis.close()
        from core.db import dispose_all

        dispose_all(close=True)
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))


def run_child(tree: Path, aof: bool, downtime: float) -> dict:
    """`measure` in a fresh interpreter whose imports (and workers) come from `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--aof", str(int(aof)), "--downtime", str(downtime)],
        env=env,
        cwd=tree,
        text=True,
        stdout=subprocess.PIPE,
        timeout=900,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    """Baseline tree and this tree, without and with AOF; JSON lines then a table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", type=Path, help="code tree to compare against")
    parser.add_argument("--downtime", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--aof", type=int, default=0)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(bool(args.aof), args.downtime)))
        return
    trees = ([("baseline", args.baseline)] if args.baseline else []) + [("new", HERE)]
    results = []
    for _ in range(args.runs):
        for aof in (False, True):
            for name, tree in trees:
                result = {"code": name, **run_child(tree.resolve(), aof, args.downtime)}
                print(json.dumps(result), flush=True)
                results.append(result)
    print(
        f"\n{'code':9} {'aof':5} {'re-run':>7} {'hand-off':>9} {'worker lost':>12} "
        f"{'pool exits':>11} {'resumed':>8} {'extra turns':>12} {'failed':>7} "
        f"{'false fail logs':>16} {'deferred':>9} {'wall s':>7}"
    )
    for r in results:
        print(
            f"{r['code']:9} {str(r['aof']):5} {r['rerun']:>4}/{r['rollouts']:<2} "
            f"{r['rerun_hand_off']:>9} {r['rerun_worker_lost']:>12} {r['worker_exits']:>11} "
            f"{r['resumed']:>8} {r['extra_turns']:>12} {r['failed']:>7} "
            f"{r['false_failure_logs']:>16} {r['deferred_to_outbox']:>9} {r['wall_s']:>7}"
        )


if __name__ == "__main__":
    main()
