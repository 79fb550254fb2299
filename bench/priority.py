"""Job priority: how soon a high-priority job gets through a training backlog.

A backlog job of `--backlog` rollouts (test-sleepy, INIT `--init-s` seconds each, one INIT
slot: INIT is the bottleneck), then, once two of them finished, an urgent job of 3 rollouts
with priority 9, and the same with priority 0 (no priority). Per run: the urgent job's wall
time and how many backlog rollouts had finished when it was done. On Redis (+ PostgreSQL)
and on the embedded default (its own Redis).

Usage: .venv/bin/python bench/priority.py [--backlog 30] [--init-s 0.5]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from pipeline import backend, wait_all  # noqa: E402

from bench.support.pipeline_harness import start_service, wait_for  # noqa: E402


def one_run(broker: str, priority: int, args: argparse.Namespace) -> dict:
    kwargs, cleanup = backend(broker)
    try:
        with tempfile.TemporaryDirectory() as home:
            svc = start_service(Path(home), concurrency={"init": 1, "run": 4, "eval": 4}, **kwargs)
            try:
                config = {"init_s": args.init_s}
                backlog = svc.client.submit(
                    "test-sleepy", [{"instance_id": f"b{k}"} for k in range(args.backlog)], agent_config=config
                )
                wait_for(lambda: svc.client.job(backlog.job_id).finished >= 2, timeout=300, what="the backlog")
                t0 = time.monotonic()
                urgent = svc.client.submit(
                    "test-sleepy", [{"instance_id": f"u{k}"} for k in range(3)], agent_config=config, priority=priority
                )
                wait_all(svc, urgent.job_id, timeout=600)
                wall = time.monotonic() - t0
                behind = svc.client.job(backlog.job_id).finished
                svc.client.cancel(backlog.job_id)
            finally:
                svc.stop()
    finally:
        cleanup()
    return {
        "broker": broker,
        "priority": priority,
        "urgent_wall_s": round(wall, 2),
        "backlog_finished_meanwhile": behind - 2,
        "backlog": args.backlog,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backlog", type=int, default=30)
    parser.add_argument("--init-s", type=float, default=0.5)
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    runs = [one_run(b, p, args) for b in ("redis+postgresql", "embedded") for p in (9, 0)]
    print(json.dumps({"init_s": args.init_s, "runs": runs}, indent=2))
    print()
    print("| broker | urgent priority | urgent job wall s | backlog rollouts finished meanwhile |")
    print("| --- | --- | --- | --- |")
    for r in runs:
        print(
            f"| {r['broker']} | {r['priority']} | {r['urgent_wall_s']} | "
            f"{r['backlog_finished_meanwhile']} of {r['backlog']} |"
        )


if __name__ == "__main__":
    main()
