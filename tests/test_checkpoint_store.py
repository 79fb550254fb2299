"""A rollout's workspace checkpoints in the pipeline (`tasks.sandboxing.checkpoints`): INIT's
manifest, RUN's saves and restore, the fallbacks to replay, and the reaper's sweep. Real
databases (SQLite and PostgreSQL) and real folders; the pipeline run is
tests/agents/test_checkpoint_pipeline.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from core.db import session_scope
from core.errors import ResumeError
from core.models import Job, Rollout
from core.settings import Settings
from migrations.runner import upgrade
from tasks.sandboxing import checkpoints
from tasks.sandboxing.checkpoints import RolloutCheckpoints


def workspace(root: Path) -> Path:
    for i in range(30):
        (root / "pkg").mkdir(parents=True, exist_ok=True)
        (root / "pkg" / f"m{i}.py").write_text(f"x = {i}\n")
    return root


def attempt(settings: Settings, tmp_path: Path, n: int, forked: bool = False, max_bytes: int = 2**20):
    """Attempt `n` of rollout r1 after its INIT: a fresh workspace and its manifest."""
    ws = workspace(tmp_path / f"ws{n}")
    checkpoints.take_manifest(settings, "r1", n, str(ws), forked)
    return ws, RolloutCheckpoints(settings, "r1", n, str(ws), None, max_bytes)


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(home=tmp_path / "home")


def test_an_attempt_restores_the_last_checkpoint_and_drops_the_earlier_attempts(settings, tmp_path) -> None:
    ws1, run1 = attempt(settings, tmp_path, 1)
    counts: dict = {}
    (ws1 / "pkg" / "m0.py").write_text("edited\n")
    run1.save(0, counts)
    (ws1 / "log.txt").write_text("once\n")
    run1.save(1, counts)
    assert counts["saved"] == 2 and counts["turn"] == 1

    ws2, run2 = attempt(settings, tmp_path, 2)
    mine: dict = {}
    assert run2.restore(1, last_logged=1, counts=mine) == 1
    assert (ws2 / "log.txt").read_text() == "once\n" and (ws2 / "pkg" / "m0.py").read_text() == "edited\n"
    assert mine["restored"]["turn"] == 1
    run2.save(1, mine)  # the new attempt's own: attempt 1's will never be read again
    assert not checkpoints.folder(settings, "r1", 1).exists()
    checkpoints.remove(settings, "r1")
    assert not (settings.checkpoints / "r1").exists()


def test_a_checkpoint_ahead_of_the_log_or_unusable_is_not_restored(settings, tmp_path) -> None:
    ws1, run1 = attempt(settings, tmp_path, 1)
    (ws1 / "new.txt").write_text("n")
    run1.save(3, {})
    ws2, run2 = attempt(settings, tmp_path, 2)
    counts: dict = {}
    assert run2.restore(1, last_logged=2, counts=counts) == -1  # turn 3's log was lost
    assert "ahead of the log" in counts["restore_skipped"] and not (ws2 / "new.txt").exists()
    (checkpoints.folder(settings, "r1", 1) / "checkpoint.tar").write_bytes(b"garbage")
    assert run2.restore(1, last_logged=5, counts=counts) == -1 and "unusable" in counts["restore_skipped"]
    assert run2.restore(7, last_logged=5, counts=counts) == -1 and "no checkpoint" in counts["restore_skipped"]


def test_a_forked_workspace_saves_none_and_replays(settings, tmp_path) -> None:
    ws, run = attempt(settings, tmp_path, 1, forked=True)
    counts: dict = {}
    (ws / "x").write_text("x")
    run.save(0, counts)
    assert counts == {"unavailable": "forked workspace"}
    assert not (checkpoints.folder(settings, "r1", 1) / "checkpoint.tar").exists()
    assert run.restore(1, 0, counts) == -1 and counts["restore_skipped"] == "forked workspace"


def test_over_the_bound_a_turn_is_skipped_and_counted(settings, tmp_path) -> None:
    ws, run = attempt(settings, tmp_path, 1, max_bytes=100)
    counts: dict = {}
    (ws / "small").write_text("s")
    run.save(0, counts)
    (ws / "big").write_bytes(b"b" * 1000)
    run.save(1, counts)
    assert (counts["saved"], counts["skipped_over_bound"], counts["turn"]) == (1, 1, 0)


def test_a_restore_that_fails_half_way_starts_the_rollout_over(settings, tmp_path, monkeypatch) -> None:
    ws1, run1 = attempt(settings, tmp_path, 1)
    (ws1 / "a").mkdir()
    (ws1 / "a" / "f").write_text("f")
    run1.save(0, {})
    ws2, run2 = attempt(settings, tmp_path, 2)
    shutil.rmtree(ws2 / "pkg")
    (ws2 / "pkg").write_text("a file where the checkpoint expects nothing in particular")
    monkeypatch.setattr("sandbox.checkpoint_restore._put", _failing)
    with pytest.raises(ResumeError, match="half restored"):
        run2.restore(1, 0, {})


def _failing(*_args) -> None:
    raise OSError("disk full")


def test_the_sweep_removes_the_checkpoints_of_rollouts_past_run(tmp_path, any_db_url) -> None:
    settings = Settings(home=tmp_path, database_url=any_db_url)
    upgrade(settings.db_url)
    with session_scope(settings.db_url) as s:
        job = Job(agent="test-sleepy", n_instances=1)
        s.add(job)
        s.flush()
        rows = {
            status: Rollout(job_id=job.id, instance_id="i", status=status)
            for status in ("pending", "run", "eval", "done", "failed")
        }
        s.add_all(rows.values())
        s.flush()
        ids = {status: row.id for status, row in rows.items()}
    for rollout_id in [*ids.values(), "unknown"]:
        (settings.checkpoints / rollout_id / "1").mkdir(parents=True)
    assert checkpoints.sweep(settings, settings.db_url) == 4
    left = {p.name for p in settings.checkpoints.iterdir()}
    assert left == {ids["pending"], ids["run"]}
