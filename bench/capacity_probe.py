"""Counts what one process asks of the database and the broker, per stage (bench/capacity.py).

Loaded into stage workers as an extra handler module (`RAAS_HANDLER_MODULES`; it registers no
handler), and imported by the benchmark itself for the gateway and reaper it runs in-process.
It counts SQL statements, commits and pool checkouts (SQLAlchemy's `before_cursor_execute`,
`commit` and `checkout` events on every engine), Celery publishes
(`before_task_publish`) and task messages consumed and acknowledged (`task_postrun`: acks are
late, one per message), each under the stage of the task the thread is running (INIT, RUN,
EVAL), else under the thread's role (heartbeat, other). Every second and after every task it
writes its counters to `$CAPACITY_PROBE_DIR/<pid>.json`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

from celery.signals import before_task_publish, task_postrun, task_prerun
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.pool import Pool

COUNTS: defaultdict[str, Counter] = defaultdict(Counter)
_local = threading.local()
_lock = threading.Lock()
OUT = os.environ.get("CAPACITY_PROBE_DIR")


def stage() -> str:
    """The stage this thread works for now, else its role."""
    current = getattr(_local, "stage", None)
    if current:
        return current
    name = threading.current_thread().name
    if name.startswith("raas-turn-writer"):
        return "run"  # RUN's turn records and mark clears, group-committed (tasks.writes.turn_log)
    if name.startswith("raas-mark-clearer"):
        return "marks"  # hand-on outbox marks, cleared in batches (tasks.writes.outbox_marks)
    return "heartbeat" if name.startswith("raas-heartbeat") else "other"


def bump(key: str, n: float = 1) -> None:
    """Count `n` of `key` under this thread's stage."""
    with _lock:
        COUNTS[stage()][key] += n


@event.listens_for(Engine, "before_cursor_execute")
def _statement(*_: object) -> None:
    bump("statements")


@event.listens_for(Engine, "commit")
def _commit(*_: object) -> None:
    bump("commits")


@event.listens_for(Pool, "checkout")
def _checkout(*_: object) -> None:
    bump("checkouts")


@before_task_publish.connect(weak=False)
def _publish(**_: object) -> None:
    bump("publishes")


@task_prerun.connect(weak=False)
def _prerun(task=None, **_: object) -> None:  # noqa: ANN001 - celery's signal signature
    _local.stage = (task.name if task else "task").rsplit(".", 1)[-1].replace("_stage", "")
    _local.started = time.perf_counter()
    bump("tasks")


@task_postrun.connect(weak=False)
def _postrun(**_: object) -> None:
    bump("acks")
    bump("task_seconds", time.perf_counter() - getattr(_local, "started", time.perf_counter()))
    _local.stage = None
    dump()


def snapshot() -> dict[str, dict[str, float]]:
    """A copy of the counters: {stage: {what: n}}."""
    with _lock:
        return {k: dict(v) for k, v in COUNTS.items()}


def reset() -> None:
    """Forget every count (the in-process part, between runs)."""
    with _lock:
        COUNTS.clear()


_dump_lock = threading.Lock()


def dump() -> None:
    """Write this process's counters (atomically) when a folder is set.

    One writer at a time: the stage threads and the per-second dumper share one temporary
    file, and two renames of it raced (one failed, logged with a traceback in the worker).
    """
    if OUT:
        path = Path(OUT) / f"{os.getpid()}.json"
        tmp = path.with_suffix(".tmp")
        with _dump_lock:
            tmp.write_text(json.dumps(snapshot()))
            tmp.replace(path)


def collect(folder: Path) -> dict[str, Counter]:
    """The counters every worker process wrote to `folder`, summed per stage."""
    total: defaultdict[str, Counter] = defaultdict(Counter)
    for path in folder.glob("*.json"):
        for key, counts in json.loads(path.read_text()).items():
            total[key].update(counts)
    return total


def _dump_every_second() -> None:
    while True:
        time.sleep(1.0)
        dump()


if OUT:
    threading.Thread(target=_dump_every_second, name="capacity-probe", daemon=True).start()
