"""Hand-offs that survive the broker, and sandboxes a killed starter cannot leak (real
SQLite/PostgreSQL, Redis and bwrap): the outbox mark of a hand-off, the drain that publishes it
to the rollout's node queue, the reaper's sweep of intent records and workspace folders. The
same with real workers and a private Redis restarted: tests/faults/test_handoff_faults.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta

import sqlalchemy as sa

from core.db import session_scope
from core.models import Job, Rollout, new_id, utcnow
from core.settings import Settings
from migrations.runner import upgrade
from sandbox.handles import pid_alive, read_handles
from sandbox.toolserver.procs import descendants, start_time
from tasks.writes import lifecycle
from tasks.broker import outbox
from tasks.recovery.reaper import Reaper
from tests.conftest import REDIS_URL
from tests.pipeline_harness import wait_for


def _rollouts(db: str, statuses: list[str], node: str = "n1") -> list[str]:
    """A job with one rollout per status (started ones leased by `w/<i>`), on `node`."""
    with session_scope(db) as s:
        job = Job(owner="o", agent="test-trivial", config={}, n_instances=len(statuses), n_samples=1)
        s.add(job)
        s.flush()
        ids = [new_id() for _ in statuses]
        s.execute(
            sa.insert(Rollout),
            [
                {
                    "id": rid,
                    "job_id": job.id,
                    "instance_id": f"i{k}",
                    "sample_index": 0,
                    "status": status,
                    "node": node,
                    "queued_at": utcnow(),
                    "created_at": utcnow(),
                    "lease_owner": f"w/{k}" if status in ("init", "run", "eval") else None,
                }
                for k, (rid, status) in enumerate(zip(ids, statuses))
            ],
        )
    return ids


def _row(db: str, rid: str) -> Rollout:
    with session_scope(db) as s:
        row = s.get(Rollout, rid)
        s.expunge(row)
        return row


def _age_marks(db: str, seconds: float) -> None:
    with session_scope(db) as s:
        s.execute(
            sa.update(Rollout)
            .where(Rollout.outbox_at.is_not(None))
            .values(outbox_at=utcnow() - timedelta(seconds=seconds))
        )


def test_a_hand_off_left_unpublished_is_drained_to_its_node_queue(any_db_url, redis_prefix, tmp_path):
    from tasks.celery_app import make_celery
    from tasks.broker.queues import queue_depths

    db = any_db_url
    upgrade(db)
    celery = make_celery(Settings(home=tmp_path, database_url=db, broker_url=REDIS_URL, broker_key_prefix=redis_prefix))
    handed, published, claimed_late = _rollouts(db, ["init", "run", "run"])
    # the status change and the mark commit together; the lease is released
    assert lifecycle.advance(db, handed, "w/0", "eval", artifact={"a": 1})
    row = _row(db, handed)
    assert (row.status, row.lease_owner, row.outbox_at is not None) == ("eval", None, True)
    # a publish that got out clears its mark (fenced on the state it was published for)
    assert lifecycle.advance(db, published, "w/1", "eval")
    assert not lifecycle.clear_mark(db, published, 1, "run")
    assert lifecycle.clear_mark(db, published, 1, "eval")
    assert _row(db, published).outbox_at is None
    # a claim clears the mark too (the message evidently got out)
    assert lifecycle.advance(db, claimed_late, "w/2", "eval")
    _age_marks(db, 60)
    assert lifecycle.claim(db, claimed_late, 1, "eval", "w/3", "n1") is not None
    assert _row(db, claimed_late).outbox_at is None

    queue = "eval.n1"
    assert outbox.drain(db, celery, grace=120) == 0  # younger than the grace: left alone
    assert outbox.drain(db, celery, grace=30) == 1
    assert queue_depths(celery, [queue]) == {queue: 1}
    assert _row(db, handed).outbox_at is None
    assert outbox.drain(db, celery, grace=0.001) == 0


def test_a_new_attempt_carries_a_mark_until_its_init_is_published(sqlite_url):
    db = sqlite_url
    upgrade(db)
    [rid] = _rollouts(db, ["run"])
    assert lifecycle.retry(db, rid, lease="w/0", error="run: boom") == 2
    row = _row(db, rid)
    assert (row.status, row.attempt, row.outbox_at is not None) == ("pending", 2, True)
    assert lifecycle.clear_mark(db, rid, 2, "pending")


HUNG_STARTER = """
import sys, time
import sandbox.bwrap
from sandbox import SandboxSpec, get_runtime
def hang(*args, **kwargs):
    print("launched", flush=True)
    time.sleep(600)
sandbox.bwrap.server_ready = hang
get_runtime("bwrap", state_dir=sys.argv[1]).start(SandboxSpec(workspace=sys.argv[2]),
                                                  label=sys.argv[3])
"""


def test_the_reaper_stops_orphaned_starts_and_removes_unowned_folders(sqlite_url, tmp_path):
    db = sqlite_url
    upgrade(db)
    settings = Settings(home=tmp_path, database_url=db, sandbox_dir=tmp_path / "sandboxes")
    starting, ended, queued = _rollouts(db, ["init", "done", "pending"])
    ws = settings.workspaces
    folders = {
        name: ws / name
        for name in (f"{starting}-1", f"{ended}-1", f"{ended}-1-eval", f"{queued}-1", "reevaluate-x", "notes")
    }
    for path in folders.values():
        path.mkdir(parents=True)
    starter = subprocess.Popen(
        [sys.executable, "-c", HUNG_STARTER, str(settings.sandbox_dir), str(folders[f"{starting}-1"]), f"{starting}:1"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert starter.stdout.readline().strip() == "launched"
    [intent] = read_handles(settings.sandbox_dir)
    launcher = intent["pid"]
    tree = wait_for(lambda: len(t := [launcher, *descendants(launcher)]) >= 3 and t, 10, "bwrap's namespace")
    starts = {pid: start_time(pid) for pid in tree}
    reaper = Reaper(settings, celery=None)
    # the attempt is live and its starter too: the start is left alone
    assert reaper.sweep_sandboxes() == 0
    assert all(pid_alive(pid, starts[pid]) for pid in tree)
    starter.send_signal(signal.SIGKILL)
    starter.wait(10)
    # the INIT worker died mid-start; its lease has not even expired yet
    assert reaper.sweep_sandboxes() == 1
    assert not any(pid_alive(pid, starts[pid]) for pid in tree)
    assert os.listdir(settings.sandbox_dir) == []
    # attempt folders no live attempt owns are gone (the ended rollout's, the queued one's
    # stale first attempt); other folders under the root are not ours to judge
    assert sorted(os.listdir(ws)) == ["notes", "reevaluate-x"]
