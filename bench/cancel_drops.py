"""How fast stale INIT messages of a cancelled job leave the queue: dropped one by one by an
INIT pool (the workers' path) vs removed by the broker purge (`tasks.broker.purge`). Prints JSON + a
table.

For each backend a real service (gateway, INIT/RUN/EVAL pools of 2 threads, reaper) gets a
1-rollout job that is cancelled; then N attempt-1 INIT messages naming that job are
published straight to the broker (as a submission's publisher would have, before the cancel)
and the time until the INIT queue is empty is measured: drops per second of one INIT pool.
Where `tasks.broker.purge` exists, `tasks.broker.purge.purge_job` is first timed alone on the same backlog
(the INIT pool stopped meanwhile): messages removed per second and the longest single script
call (how long Redis is busy at once). On such a tree the pool's "drops" include the purge a
worker runs when it drops a cancelled job's message (`cancels.CancelMemory.drop_stale`). `--init-ahead`
runs the pool as `raas node` does (INIT backpressure on: a database count after every INIT
task, dropped ones included, before this change).

Usage: .venv/bin/python bench/cancel_drops.py [--n 5000] [--backend all|embedded|redis+postgresql]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.pipeline import backend  # noqa: E402
from bench.support.pipeline_harness import start_service  # noqa: E402


def _stale(celery: Any, job_id: str, n: int, headerless: bool = False) -> None:
    """n first-attempt INIT messages of the job, published in batches like the outbox does
    (`headerless`: as before the purge, without the `raas_job` header it reads)."""
    from tasks.broker.config import TASK_NAMES, message_priority
    from tasks.broker.publish import publish

    with celery.producer_or_acquire() as producer, producer.batch(max_size=500):
        for _ in range(n):
            if headerless:
                celery.send_task(
                    TASK_NAMES["init"],
                    args=[uuid.uuid4().hex, 1],
                    kwargs={"job": job_id},
                    producer=producer,
                    priority=message_priority(None),
                )
            else:
                publish(celery, "init", uuid.uuid4().hex, 1, producer=producer, job=job_id)


def _depth(celery: Any) -> int:
    from tasks.broker.queues import queue_depths

    return queue_depths(celery, ["init"])["init"]


def _until_empty(celery: Any, timeout: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if _depth(celery) == 0:
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


def _timed_purge(celery: Any, job_id: str) -> tuple[int, float, float]:
    """Purge with each script call timed: (removed, seconds, longest call ms)."""
    from tasks.broker import purge

    longest = 0.0
    original = purge._purge_list

    def timed(script: Any, *args: Any) -> int:
        def call(**kw: Any) -> Any:
            nonlocal longest
            t = time.perf_counter()
            out = script(**kw)
            longest = max(longest, time.perf_counter() - t)
            return out

        return original(call, *args)

    purge._purge_list = timed
    try:
        t0 = time.monotonic()
        removed = purge.purge_job(celery, job_id)
        return removed or 0, time.monotonic() - t0, longest * 1000
    finally:
        purge._purge_list = original


def has_purge() -> bool:
    """False on a tree before `tasks.broker.purge` (the baseline: workers' drops only)."""
    import importlib.util

    return importlib.util.find_spec("tasks.broker.purge") is not None


def run_backend(name: str, n: int, init_ahead: bool, timeout: float, headerless: bool = False) -> list[dict]:
    kwargs, cleanup = backend(name)
    extra = {"init_ahead": 64} if init_ahead else {}
    rows = []
    with tempfile.TemporaryDirectory() as home:
        svc = start_service(Path(home), nodes=("bench",), concurrency=2, **kwargs, extra=extra)
        celery = svc._celery
        try:
            warm = svc.client.submit("test-trivial", [{"instance_id": "warm"}])
            svc.wait_done(warm.job_id, timeout=600)
            job = svc.client.submit("test-sleepy", [{"instance_id": "x"}], agent_config={"init_s": 0.0})
            svc.wait_done(job.job_id, timeout=120)
            from core.db import session_scope
            from core.models import Job

            with session_scope(svc.settings.db_url) as s:  # a finished job's cancel flag, set as a cancel does
                s.get(Job, job.job_id).cancel_requested = True
            label = f"{name}{' init_ahead' if init_ahead else ''}{' headerless' if headerless else ''}"
            if has_purge():  # alone: no INIT pool takes (or purges) meanwhile
                svc.kill_worker("init", "bench")
                _stale(celery, job.job_id, n)
                removed, took, longest = _timed_purge(celery, job.job_id)
                rows.append(
                    {
                        "backend": label,
                        "path": "purge",
                        "messages": removed,
                        "seconds": round(took, 3),
                        "per_s": round(removed / took),
                        "longest_call_ms": round(longest, 2),
                    }
                )
                svc.start_worker("init", "bench", 2)
                ready = svc.client.submit("test-trivial", [{"instance_id": "ready"}])
                svc.wait_done(ready.job_id, timeout=600)
            _stale(celery, job.job_id, n, headerless)
            took = _until_empty(celery, timeout)
            rows.append(
                {
                    "backend": label,
                    "path": "workers drop (2-thread INIT pool)",
                    "messages": n,
                    "seconds": round(took, 2) if took else f">{timeout}",
                    "per_s": round(n / took) if took else None,
                }
            )
        finally:
            svc.stop()
            cleanup()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--backend", default="all", choices=["all", "embedded", "redis+postgresql"])
    parser.add_argument("--init-ahead", action="store_true", help="INIT backpressure on, as under `raas node`")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--headerless", action="store_true", help="the pool's messages lack the purge's header: one drop each"
    )
    args = parser.parse_args()
    names = ["redis+postgresql", "embedded"] if args.backend == "all" else [args.backend]
    rows = [r for b in names for r in run_backend(b, args.n, args.init_ahead, args.timeout, args.headerless)]
    print(json.dumps(rows, indent=2))
    print("\n| backend | path | messages | seconds | per second | longest script call ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['backend']} | {r['path']} | {r['messages']} | {r['seconds']} | {r['per_s']} | "
            f"{r.get('longest_call_ms', '')} |"
        )


if __name__ == "__main__":
    main()
