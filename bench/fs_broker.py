"""Embedded broker benchmark: cost of a poll with a backlog. Prints JSON + a table.

Baseline, in the same run: kombu's own filesystem transport (one shared folder, listed and
sorted on every poll) with raas' earlier atomic put — the embedded broker before this change.
New: tasks/fs_transport.py (a folder per queue, sorted listing cached per consumer).

For a backlog of N messages in queue `init` it measures: an idle poll of another (empty)
queue, as every RUN/EVAL consumer does 20 times a second; taking messages from the backlog
(mean over the first `--take` of them); the CPU one idle consumer burns polling for 2 s.

Usage: .venv/bin/python bench/fs_broker.py [--n 10000] [--take 500]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from kombu import Connection
from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.transport.virtual import Empty
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tasks.fs_transport import Transport as NewTransport  # noqa: E402


class BaselineChannel(filesystem.Channel):
    """kombu's filesystem channel with the atomic put raas used before (baseline)."""

    def _put(self, queue, payload, **kwargs):  # noqa: ANN001
        name = f"{int(round(time.monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        staging = os.path.join(self.data_folder_out, f".staging-{uuid.uuid4().hex}")
        try:
            with open(staging, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(staging, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class BaselineTransport(filesystem.Transport):
    """Transport of the baseline channel."""

    Channel = BaselineChannel


def measure(name: str, transport: type, n: int, take: int) -> dict:
    """Fill `init` with n messages, then time idle polls, takes and idle CPU."""
    with tempfile.TemporaryDirectory() as folder:
        conn = Connection(transport=transport, transport_options={
            "data_folder_in": folder, "data_folder_out": folder, "control_folder": folder})
        ch = conn.default_channel
        payload = {"body": "x" * 600, "headers": {"task": "raas.init"}}  # a stage message's size
        t0 = time.perf_counter()
        for _ in range(n):
            ch._put("init", payload)
        put_s = time.perf_counter() - t0
        idle = []
        for _ in range(50):
            t = time.perf_counter()
            try:
                ch._get("run.node-a")
            except Empty:
                pass
            idle.append(time.perf_counter() - t)
        t = time.perf_counter()
        for _ in range(take):
            ch._get("init")
        take_ms = (time.perf_counter() - t) / take * 1000
        cpu0, end = time.process_time(), time.monotonic() + 2.0
        polls = 0
        while time.monotonic() < end:  # one idle consumer at the transport's 50 ms interval
            try:
                ch._get("run.node-a")
            except Empty:
                pass
            polls += 1
            time.sleep(0.05)
        idle_cpu = (time.process_time() - cpu0) / 2.0
        conn.release()
    return {"transport": name, "backlog": n, "put_us": round(put_s / n * 1e6, 1),
            "idle_poll_ms_p50": round(statistics.median(idle) * 1000, 3),
            "take_ms_mean": round(take_ms, 3), "idle_consumer_cpu_cores": round(idle_cpu, 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 10_000, 51_200])
    parser.add_argument("--take", type=int, default=300)
    args = parser.parse_args()
    rows = [measure(label, t, n, args.take) for n in args.n
            for label, t in (("kombu filesystem (baseline)", BaselineTransport),
                             ("raas fs_transport", NewTransport))]
    print(json.dumps(rows, indent=2))
    print("\n| transport | backlog | put µs | idle poll ms (p50) | take ms (mean) | "
          "idle consumer CPU (cores) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['transport']} | {r['backlog']} | {r['put_us']} | {r['idle_poll_ms_p50']} | "
              f"{r['take_ms_mean']} | {r['idle_consumer_cpu_cores']} |")


if __name__ == "__main__":
    main()
