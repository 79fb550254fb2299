"""A group's layer is prepared once per node, whoever races for it (`tasks.sandboxing.group_layers`).

Real databases (SQLite and PostgreSQL), real threads racing as INIT workers do; the prepare
step is a function that fills a folder (the pipeline's is the handler's INIT in a sandbox,
tested whole in tests/agents/test_group_fork_pipeline.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from core.db import session_scope
from core.errors import StageTimeout
from core.models import GroupLayer, Job, LayerStatus, Rollout, utcnow
from core.settings import Settings
from migrations.runner import upgrade
from tasks.sandboxing import group_layers


@dataclass
class FakeInitContext:
    """The two things `layer_for` asks of INIT's context (a fake: no handler, no sandbox)."""

    instance_id: str
    deadline: float

    def checkpoint(self) -> None:
        if time.monotonic() > self.deadline:
            raise StageTimeout("init deadline passed")


@pytest.fixture
def world(tmp_path, any_db_url):
    settings = Settings(home=tmp_path, node="n1", database_url=any_db_url, lease_timeout=1.0, heartbeat_interval=0.2)
    upgrade(settings.db_url)
    with session_scope(settings.db_url) as s:
        job = Job(agent="test-sleepy", n_instances=1)
        s.add(job)
        s.flush()
        s.add_all([Rollout(job_id=job.id, instance_id="inst", status="init", sample_index=k) for k in range(8)])
        job_id = job.id
    return settings, job_id


def filler(calls: list[str], seconds: float = 0.3, fail: bool = False):
    def prepare(path: str) -> str:
        calls.append(path)
        Path(path).mkdir(parents=True)
        (Path(path) / "repo.txt").write_text("prepared")
        time.sleep(seconds)
        if fail:
            raise RuntimeError("the handler's init failed")
        return "overlay"

    return prepare


def test_eight_racing_samples_prepare_once_and_all_fork_the_same_layer(world):
    settings, job_id = world
    calls: list[str] = []
    layers, errors = [], []

    def sample() -> None:
        try:
            ctx = FakeInitContext("inst", time.monotonic() + 30)
            layers.append(group_layers.layer_for(settings, ctx, job_id, filler(calls)))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=sample) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(calls) == 1 and len(layers) == 8
    assert {(x.id, x.path, x.mode) for x in layers} == {(layers[0].id, calls[0], "overlay")}
    assert (Path(calls[0]) / "repo.txt").read_text() == "prepared"
    with session_scope(settings.db_url) as s:
        row = s.query(GroupLayer).one()
        assert row.status == LayerStatus.READY.value and row.prepared_seconds >= 0.3 and row.lease_owner is None


def test_a_dead_preparer_is_taken_over_once_its_lease_is_stale(world):
    settings, job_id = world
    with session_scope(settings.db_url) as s:  # a preparer that was killed 5 s ago
        s.add(
            GroupLayer(
                id="a" * 32,
                job_id=job_id,
                instance_id="inst",
                node="n1",
                status="preparing",
                lease_owner="dead",
                heartbeat_at=utcnow() - timedelta(seconds=5),
                path=str(group_layers.layers_root(settings) / "dead"),
            )
        )
    (group_layers.layers_root(settings) / "dead").mkdir(parents=True)
    calls: list[str] = []
    layer = group_layers.layer_for(settings, FakeInitContext("inst", time.monotonic() + 10), job_id, filler(calls, 0))
    assert len(calls) == 1 and layer.path == calls[0] and layer.id == "a" * 32
    # the dead one's folder is nobody's now: the reaper's sweep removes it, keeps the live one
    assert group_layers.sweep(settings) == 0
    assert not (group_layers.layers_root(settings) / "dead").exists() and Path(layer.path).is_dir()


def test_a_live_preparer_is_waited_for_not_taken_over(world):
    settings, job_id = world
    calls: list[str] = []
    first = threading.Thread(
        target=group_layers.layer_for,
        args=(settings, FakeInitContext("inst", time.monotonic() + 30), job_id, filler(calls, 2.5)),
    )
    first.start()
    time.sleep(0.3)  # longer than the lease timeout (1 s) is the preparation: its beats hold it
    layer = group_layers.layer_for(settings, FakeInitContext("inst", time.monotonic() + 30), job_id, filler(calls))
    first.join()
    assert len(calls) == 1 and layer.path == calls[0]


def test_a_failed_preparation_is_tried_again_by_the_next_sample_and_a_waiter_times_out(world):
    settings, job_id = world
    calls: list[str] = []
    with pytest.raises(RuntimeError, match="init failed"):
        group_layers.layer_for(settings, FakeInitContext("inst", time.monotonic() + 5), job_id, filler(calls, 0, True))
    assert not Path(calls[0]).exists()  # a failed preparation leaves no folder
    layer = group_layers.layer_for(settings, FakeInitContext("inst", time.monotonic() + 5), job_id, filler(calls, 0))
    assert len(calls) == 2 and layer.path == calls[1]
    with session_scope(settings.db_url) as s:  # a preparer that beats but never finishes
        s.query(GroupLayer).update({"status": "preparing", "lease_owner": "slow", "heartbeat_at": utcnow()})
    with pytest.raises(StageTimeout):
        group_layers.layer_for(settings, FakeInitContext("inst", time.monotonic() + 0.3), job_id, filler(calls))


def test_the_sweep_removes_a_layer_once_no_sample_can_use_it(world):
    settings, job_id = world
    layer = group_layers.layer_for(settings, FakeInitContext("inst", time.monotonic() + 5), job_id, filler([], 0))
    with session_scope(settings.db_url) as s:
        s.query(Rollout).update({"status": "eval"})
        s.query(Rollout).filter(Rollout.sample_index == 3).update({"status": "run"})
    assert group_layers.sweep(settings) == 0 and Path(layer.path).is_dir()  # sample 3 still runs
    with session_scope(settings.db_url) as s:
        s.query(Rollout).update({"status": "done"})
    assert group_layers.sweep(settings) == 1 and not Path(layer.path).exists()
    with session_scope(settings.db_url) as s:
        assert s.query(GroupLayer).one().status == LayerStatus.REMOVED.value
        s.query(Rollout).filter(Rollout.sample_index == 3).update({"status": "pending"})  # a retry
    calls: list[str] = []
    again = group_layers.layer_for(settings, FakeInitContext("inst", time.monotonic() + 5), job_id, filler(calls, 0))
    assert calls == [again.path] and again.path != layer.path  # prepared again, in a new folder


def test_who_forks_and_a_job_may_not_fork_an_agent_that_does_not_declare_it(tmp_path):
    from agents.job_config import JobConfig
    from agents.registry import get_handler
    from app.jobs import validate_submission
    from app.schemas import JobCreate
    from core.errors import InvalidRequest

    swe, math = get_handler("swe"), get_handler("math")
    default, on, off = (JobConfig.load({"sandbox": s}) for s in ({}, {"group_fork": True}, {"group_fork": False}))
    assert group_layers.wanted(default, swe, "bwrap", 8) and group_layers.wanted(on, swe, "bwrap", 1)
    assert not group_layers.wanted(default, swe, "bwrap", 1)  # no group: nothing to share
    assert not group_layers.wanted(off, swe, "bwrap", 8) and not group_layers.wanted(default, swe, "none", 8)
    assert not group_layers.wanted(default, math, "bwrap", 8)
    with pytest.raises(InvalidRequest):
        group_layers.wanted(on, math, "bwrap", 8)
    request = JobCreate(
        agent="math",
        instances=[{"instance_id": "a", "data": {"problem": "1+1", "answer": "2"}}],
        n_samples=4,
        sandbox={"group_fork": True},
    )
    with pytest.raises(InvalidRequest) as refused:
        validate_submission(Settings(home=tmp_path), request)
    assert refused.value.details.get("field") == "sandbox.group_fork"


def test_a_dead_samples_fork_and_its_groups_layer_leave_nothing(tmp_path, sqlite_url):
    """A worker killed mid-RUN of a forked sample: the reaper stops its sandbox and removes its
    fork folder, then the group's layer once no sample can use it (real bwrap, real reaper)."""
    from sandbox.bwrap import unprivileged_uid
    from sandbox.handles import give_workspace
    from sandbox.settings import SandboxSettings
    from tasks.sandboxing import sandboxes
    from tasks.recovery.reaper import Reaper
    from tests.sandbox.conftest import host_processes_matching

    settings = Settings(home=tmp_path, node="n1", database_url=sqlite_url, sandbox_pool_size=0)
    upgrade(settings.db_url)
    with session_scope(settings.db_url) as s:
        job = Job(agent="swe", n_instances=1)
        s.add(job)
        s.flush()
        rollout = Rollout(job_id=job.id, instance_id="inst", status="run", node="n1", attempt=1)
        s.add(rollout)
        s.flush()
        job_id, rollout_id = job.id, rollout.id

    def prepare(path: str) -> str:
        Path(path).mkdir(parents=True)
        (Path(path) / "repo.txt").write_text("prepared")
        uid = unprivileged_uid(SandboxSettings())
        if uid is not None:
            give_workspace(path, uid)
        return "overlay"

    layer = group_layers.layer_for(settings, FakeInitContext("inst", time.monotonic() + 30), job_id, prepare)
    sb, handle = sandboxes.start_fork(settings, {}, rollout_id, 1, "bwrap", layer.path, layer.mode)
    assert sb.bash("cat repo.txt && echo mine > new.txt").output == "prepared"
    fork = Path(handle["workspace"]).parent
    assert fork.name == f"{rollout_id}-1-fork" and host_processes_matching(str(fork))
    with session_scope(settings.db_url) as s:  # its worker died; the attempt was ended
        s.query(Rollout).update({"status": "failed"})
    reaper = Reaper(settings, None)
    assert reaper.sweep_sandboxes() == 1
    assert not fork.exists() and not host_processes_matching(str(fork))
    assert Path(layer.path, "repo.txt").read_text() == "prepared"  # the layer is the group's
    assert group_layers.sweep(settings) == 1 and not Path(layer.path).exists()
    assert not list(group_layers.layers_root(settings).iterdir())
