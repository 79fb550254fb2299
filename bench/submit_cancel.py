"""Submit/cancel benchmark: what one large job costs the gateway. Prints JSON + a table.

For each backend (Redis + PostgreSQL, embedded SQLite + embedded Redis) a real service
(gateway over HTTP, INIT/RUN/EVAL worker processes, reaper) receives one job of N rollouts
(default 10,000) of a handler whose INIT sleeps, so nearly all of them are still queued when
the job is cancelled; a few are running and stop cooperatively. Measured:

- submit: POST /v1/jobs until its 202, and until every rollout is published (outbox empty);
- cancel: POST /v1/jobs/{id}/cancel until its answer (every queued rollout terminal);
- /healthz: a thread polls it every 20 ms throughout; max and p99 latency per phase;
- after the cancel: how long a new 1-rollout job waits behind the stale messages (until done),
  how many messages the INIT queue holds when the cancel answers, and how long until it is
  first seen empty (polled every 50 ms from the answer on); where the cancel purges the
  broker (`tasks.broker.purge`), how many it removed and how long that took inside the cancel.

Baseline: the same script run on the tree before this change (`git archive 4be9411`: one
broker round trip per message inside the request, one `terminal.finish` transaction per
queued rollout, kombu's filesystem polling); it only needs `test-sleepy`/`test-trivial`.

Usage: .venv/bin/python bench/submit_cancel.py [--n 10000] [--backend all|embedded|redis+postgresql]
       (needs Redis :6379 and PostgreSQL :5432)
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.pipeline import backend  # noqa: E402
from bench.support.pipeline_harness import start_service  # noqa: E402

SLEEPY = {"init_s": 1.0, "run_s": 20.0, "turns": 20}  # RUN checks cancel every turn
POLL_S = 0.02


class HealthPoller:
    """Polls /healthz on its own connection and keeps (start time, latency) samples."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=30)
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            self.http.get("/healthz").raise_for_status()
            self.samples.append((t0, time.monotonic() - t0))
            self._stop.wait(POLL_S)

    def __enter__(self) -> HealthPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.http.close()

    def during(self, start: float, end: float) -> dict[str, float]:
        """Max and p99 latency (ms) of polls that overlapped [start, end]."""
        lat = sorted(d for t, d in self.samples if t <= end and t + d >= start)
        if not lat:
            return {"n": 0, "max_ms": 0.0, "p99_ms": 0.0}
        return {
            "n": len(lat),
            "max_ms": round(lat[-1] * 1000, 1),
            "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 1),
        }


class PurgeLog(logging.Handler):
    """Catches the gateway's purge log line (`tasks.broker.purge`, same process): removed, seconds."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: list[tuple[int, float]] = []
        self.logger = logging.getLogger("tasks.broker.purge")
        self.level_before = self.logger.level
        self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        if "removed" in record.msg:
            self.seen.append((int(record.args[1]), round(float(record.args[2]), 3)))

    def close(self) -> list | None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level_before)
        return list(self.seen[0]) if self.seen else None


class EmptyPoller:
    """From the cancel's answer on, polls the INIT queue's depth every 50 ms until it is 0."""

    def __init__(self, celery) -> None:
        from tasks.broker.queues import queue_depths

        self.when: float | None = None
        self._stop = threading.Event()

        def loop() -> None:
            while not self._stop.is_set():
                if queue_depths(celery, ["init"])["init"] == 0:
                    self.when = time.monotonic()
                    return
                self._stop.wait(0.05)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def wait(self, timeout: float) -> float | None:
        """When the queue was first seen empty (monotonic), or None after `timeout`."""
        self._thread.join(timeout)
        self._stop.set()
        return self.when


def _outbox_left(db_url: str, job_id: str) -> int | None:
    """Rollouts of the job still waiting to be published (None: no outbox in this code)."""
    from core.db import session_scope
    from core.models import Rollout

    if not hasattr(Rollout, "outbox_at"):
        return None
    with session_scope(db_url) as s:
        return s.scalar(
            sa.select(sa.func.count())
            .select_from(Rollout)
            .where(Rollout.job_id == job_id, Rollout.outbox_at.is_not(None))
        )


def _wait(predicate, timeout: float, step: float = 0.05) -> float | None:
    """Seconds until predicate() is true, or None after timeout."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if predicate():
            return time.monotonic() - t0
        time.sleep(step)
    return None


def run_backend(name: str, n: int, after_timeout: float) -> dict:
    """One service, one job of n rollouts: submit, cancel, then a 1-rollout job."""
    from tasks.broker.queues import queue_depths

    kwargs, cleanup = backend(name)
    with tempfile.TemporaryDirectory() as home:
        svc = start_service(
            Path(home), nodes=("bench",), concurrency=2, **kwargs, extra={"reaper_interval": 2.0, "requeue_after": 60.0}
        )
        celery = svc._reaper.celery
        svc.client.http.timeout = httpx.Timeout(900.0)  # the per-row cancel took minutes
        try:
            warm = svc.client.submit("test-trivial", [{"instance_id": "warm"}])
            svc.wait_done(warm.job_id, timeout=600)
            instances = [{"instance_id": f"i{k:05d}"} for k in range(n // 8)]
            row: dict = {"backend": name, "rollouts": len(instances) * 8}
            with HealthPoller(svc.url) as health:
                time.sleep(0.5)
                t0 = time.monotonic()
                job = svc.client.submit("test-sleepy", instances, n_samples=8, agent_config=SLEEPY)
                t_202 = time.monotonic()
                drained = _wait(lambda: not _outbox_left(svc.settings.db_url, job.job_id), timeout=300)
                t_pub = time.monotonic()
                row["submit_202_s"] = round(t_202 - t0, 3)
                row["submit_published_s"] = round(t_pub - t0, 3) if drained is not None else None
                row["healthz_submit"] = health.during(t0, t_pub)
                row["healthz_request"] = health.during(t0, t_202)  # the POST itself
                row["healthz_publish"] = health.during(t_202, t_pub)  # after the 202
                time.sleep(2.0)  # let the INIT pool claim a few, so some are running
                running = svc.client.job(job.job_id).counts
                purges = PurgeLog()
                t1 = time.monotonic()
                view = svc.client.cancel(job.job_id)
                t2 = time.monotonic()
                empty_poll = EmptyPoller(celery)
                row["cancel_s"] = round(t2 - t1, 3)
                row["init_queue_at_cancel_answer"] = queue_depths(celery, ["init"])["init"]
                row["purge"] = purges.close()  # removed, seconds (None: no purge in this code)
                row["healthz_cancel"] = health.during(t1, t2)
                row["counts_before_cancel"] = running
                row["counts_after_cancel"] = view.counts
                final = _wait(lambda: svc.client.job(job.job_id).finished >= row["rollouts"], timeout=120, step=0.2)
                row["all_terminal_s"] = round(final, 2) if final is not None else None
                t3 = time.monotonic()
                one = svc.client.submit("test-trivial", [{"instance_id": "after"}])
                waited = _wait(lambda: svc.client.job(one.job_id).finished >= 1, timeout=after_timeout, step=0.1)
                row["next_job_done_s"] = round(waited, 2) if waited is not None else f">{after_timeout}"
                empty = empty_poll.wait(after_timeout)
                row["init_queue_empty_s"] = round(empty - t2, 2) if empty is not None else f">{after_timeout}"
                row["healthz_after"] = health.during(t3, time.monotonic())
                row["healthz_all"] = health.during(t0, time.monotonic())
        finally:
            svc.stop()
            cleanup()
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10_000, help="rollouts (instances x 8)")
    parser.add_argument("--backend", default="all", choices=["all", "embedded", "redis+postgresql"])
    parser.add_argument(
        "--after-timeout", type=float, default=240.0, help="longest wait for the 1-rollout job after the cancel"
    )
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per /healthz poll
    names = ["redis+postgresql", "embedded"] if args.backend == "all" else [args.backend]
    rows = [run_backend(b, args.n, args.after_timeout) for b in names]
    print(json.dumps(rows, indent=2))
    print(
        "\n| backend | rollouts | submit 202 s | published s | cancel s | "
        "healthz max ms (submit / cancel / after) | purge (removed, s) | INIT queue at the answer | "
        "next 1-rollout job s | INIT queue empty s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        hz = " / ".join(str(r[k]["max_ms"]) for k in ("healthz_submit", "healthz_cancel", "healthz_after"))
        print(
            f"| {r['backend']} | {r['rollouts']} | {r['submit_202_s']} | "
            f"{r['submit_published_s']} | {r['cancel_s']} | {hz} | {r['purge']} | "
            f"{r['init_queue_at_cancel_answer']} | {r['next_job_done_s']} | "
            f"{r['init_queue_empty_s']} |"
        )


if __name__ == "__main__":
    main()
