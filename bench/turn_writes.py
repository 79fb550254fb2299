"""The RUN hot path's database work per turn, alone: CPU and commits per turn, before/after.

What `bench/hot_path.py` measures inside a whole service, isolated here so that the shared
machine's noise (simulators, Celery, other engineers' jobs) stays out of the figure: `threads`
threads of one process each hold a leased rollout on PostgreSQL and do, per turn, exactly the
database calls a RUN does around one generation of the `search` handler — the generation mark
and its server read (`begin_generation`), the mark's clear (`end_generation`), and the turn's
record (`lifecycle.record_turn`, the same row as a real turn) — with `gap` seconds of idle
"generation" between turns. Each tree runs in its own process (PYTHONPATH), on its own fresh
database, in turn, same command; figures are process CPU (utime + stime) per turn, commits
per turn (SQLAlchemy `commit` events plus statements run in autocommit) and statements per
turn.

Usage: .venv/bin/python bench/turn_writes.py [--baseline-tree DIR]   (DIR: another commit's tree)
       [--threads 64] [--turns 20] [--gap 0.05] [--window 0.005]   (needs PostgreSQL :5432)
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
FIELDS = {
    "generated_ids": list(range(40)),
    "logprobs": [-0.5] * 40,
    "text": '<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>',
    "tool_calls": [{"name": "search", "arguments": {"query": "q"}}],
    "observation": "passage " * 60,
    "observation_ids": list(range(120)),
    "observation_messages": [{"role": "tool", "content": "passage " * 60}],
    "finish_reason": "stop",
    "llm_server": "http://sim:1",
    "weight_version": "v1",
    "gen_seconds": 1.0,
    "tool_seconds": 0.01,
    "extra": {"context_length": 16384},
    "loop_state": {"turns": 1, "tool_calls": 1, "handler_state": {}},
}


def run_one(args: argparse.Namespace) -> dict:
    """This tree (the one on PYTHONPATH): `threads` rollouts x `turns` turns."""
    import sqlalchemy as sa

    from core.db import dispose_all, get_engine, session_scope
    from core.models import Job, LLMServer, Rollout, utcnow
    from migrations.runner import upgrade
    from tasks.writes import lifecycle
    from tasks.llm.llm_pool import RegisteredPool

    db = f"raas_tw_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{db}"'))
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{db}"
    try:
        upgrade(url)
        with session_scope(url) as s:
            s.add(LLMServer(url="http://sim:1", model="m", weight_version="v1"))
            job = Job(agent="search", config={}, n_instances=args.threads)
            s.add(job)
            s.flush()
            ids = [f"r{k:03d}" for k in range(args.threads)]
            s.add_all(
                [
                    Rollout(
                        id=rid,
                        job_id=job.id,
                        instance_id=rid,
                        status="run",
                        lease_owner=f"L-{rid}",
                        heartbeat_at=utcnow(),
                    )
                    for rid in ids
                ]
            )
        counts = {"commits": 0, "statements": 0, "autocommit": 0}
        engine = get_engine(url)
        lock = threading.Lock()

        def bump(key: str) -> None:
            with lock:
                counts[key] += 1

        sa.event.listen(engine, "commit", lambda *_: bump("commits"))

        def statement(conn, *_: object) -> None:  # noqa: ANN001
            bump("statements")
            if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
                bump("autocommit")  # commits as it ends: no commit event

        sa.event.listen(engine, "before_cursor_execute", statement)
        takes = inspect.signature(lifecycle.record_turn).parameters
        window = "window" in takes
        writes = None
        if "writes" in takes:  # a tree whose turn log is a part of the worker process
            from tasks.writes.turn_log import TurnLog

            writes = TurnLog(url, args.window)
            writes.start()

        def loop(rid: str) -> None:
            pool = RegisteredPool(url, "vllm", rid, f"L-{rid}", **({"writes": writes} if writes else {}))
            for index in range(args.turns):
                pool.begin_generation("http://sim:1")
                time.sleep(args.gap)  # the generation
                pool.end_generation()
                extra = {"window": args.window} if window else {"writes": writes} if writes else {}
                lifecycle.record_turn(url, rid, 1, lease=f"L-{rid}", index=index, **extra, **FIELDS)

        threads = [threading.Thread(target=loop, args=(rid,)) for rid in ids]
        cpu0, t0 = os.times(), time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cpu1, wall = os.times(), time.monotonic() - t0
        turns = args.threads * args.turns
        cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
        with session_scope(url) as s:
            stored = s.scalar(sa.text("SELECT count(*) FROM turns"))
        return {
            "tree": args.label,
            "threads": args.threads,
            "turns": turns,
            "turns_stored": stored,
            "wall_s": round(wall, 2),
            "cpu_ms_per_turn": round(cpu / turns * 1000, 3),
            "commits_per_turn": round((counts["commits"] + counts["autocommit"]) / turns, 3),
            "statements_per_turn": round(counts["statements"] / turns, 3),
        }
    finally:
        dispose_all(close=True)
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline-tree", required=False, default=None)
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--gap", type=float, default=0.05)
    parser.add_argument("--repeat", type=int, default=2, help="alternating runs per tree")
    parser.add_argument("--window", type=float, default=0.005, help="turn_batch_window of the after tree (seconds)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--label", default="after", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args)))
        return
    trees = [("after", REPO)]
    if args.baseline_tree:
        trees.insert(0, ("before", Path(args.baseline_tree)))
    report = []
    for _ in range(args.repeat):
        for label, tree in trees:
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--one",
                "--label",
                label,
                "--threads",
                str(args.threads),
                "--turns",
                str(args.turns),
                "--gap",
                str(args.gap),
                "--window",
                str(args.window),
            ]
            out = subprocess.run(
                cmd, env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree, check=True, capture_output=True, text=True
            )
            report.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(json.dumps(report, indent=2))
    print("\n| tree | turns | stored | wall s | CPU ms/turn | commits/turn | statements/turn |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in report:
        print(
            f"| {r['tree']} | {r['turns']} | {r['turns_stored']} | {r['wall_s']} | "
            f"{r['cpu_ms_per_turn']} | {r['commits_per_turn']} | "
            f"{r['statements_per_turn']} |"
        )


if __name__ == "__main__":
    main()
