"""Straggler cuts through the real pipeline: spare samples, infrastructure failures that never
fill a group, short groups, and per-group deadlines (real Celery workers, Redis, PostgreSQL)."""

from __future__ import annotations

from datetime import datetime

import httpx
import pytest

from fakellm.server import BUNDLED_TOKENIZER, start_simulator
from tests.conftest import REDIS_URL
from bench.support.pipeline_harness import start_service
from raas_client.models import RolloutView

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`


@pytest.fixture
def service(tmp_path, pg_url, redis_prefix):
    """A service on Redis + PostgreSQL; an infrastructure failure is final (one attempt)."""
    svc = start_service(
        tmp_path,
        db_url=pg_url,
        broker_url=REDIS_URL,
        key_prefix=redis_prefix,
        handler_modules="tests.straggler_handlers",
        extra={"max_attempts": 1},
    )
    yield svc
    svc.stop()


def seconds(start: datetime | None, end: datetime | None) -> float:
    """Seconds between two timestamps of the wire records."""
    assert start is not None and end is not None
    return (end - start).total_seconds()


def by_instance(rows: list[RolloutView]) -> dict[str, list[RolloutView]]:
    out: dict[str, list[RolloutView]] = {}
    for row in rows:
        out.setdefault(row.instance_id, []).append(row)
    return out


def test_spares_complete_groups_with_the_first_usable_and_cut_the_rest(service) -> None:
    instances = [
        # two fast samples fill the group; the two stragglers (30 s) are cut
        {"instance_id": "tail", "run_s": [0.2, 0.4, 30, 30]},
        # infrastructure failures have no reward: the two others fill the group
        {"instance_id": "infra", "run_s": [0.2, 0.2, 0.5, 0.6], "fail": [0, 1]},
        # three failures leave one usable sample: a short group, with its reason
        {"instance_id": "short", "run_s": [0.2, 0.2, 0.2, 0.2], "fail": [0, 1, 2]},
        # graded timeouts have a reward but are no policy samples (failure_class infra)
        {"instance_id": "timeouts", "run_s": [0.1, 0.1, 0.6, 0.7], "timeout": [0, 1]},
    ]
    job = service.client.submit("test-straggler", instances, n_samples=2, spare=2)
    assert len(job.rollout_ids) == 16
    view = service.wait_done(job.job_id, timeout=60)
    assert view.n_samples == 2 and view.spare == 2 and view.n_rollouts == 16
    rows = service.all_results(job.job_id)
    assert sorted(r.seq for r in rows) == list(range(1, 17))
    groups = by_instance(rows)
    for name, rows_of in groups.items():
        closers = [r for r in rows_of if r.group_complete]
        assert len(closers) == 1, (name, closers)  # a group completes once
        record = closers[0].group
        members = [r for r in rows_of if r.rollout_id in record.members]
        assert all(r.reward == 1.0 and r.cut_reason is None and r.outcome == "completed" for r in members)
        assert all(r.rollout_id not in record.members for r in rows_of if r.cut_reason)
        assert closers[0].seq >= max(r.seq for r in members)
    tail = groups["tail"]
    record = next(r.group for r in tail if r.group_complete)
    assert record.status == "complete" and len(record.members) == 2
    cut = [r for r in tail if r.cut_reason]
    assert sorted(r.sample_index for r in cut) == [2, 3] and sorted(record.cut) == sorted(r.rollout_id for r in cut)
    assert all(r.status == "cancelled" and r.reward is None for r in cut)
    # the 30 s stragglers were stopped, not waited for (counted from the group's start:
    # worker start-up on a loaded machine is not the cut's business)
    assert max(seconds(record.started_at, r.finished_at) for r in cut) < 15
    assert all("first 2 usable" in r.cut_reason for r in cut)
    infra = next(r.group for r in groups["infra"] if r.group_complete)
    assert infra.status == "complete"
    assert sorted(r.sample_index for r in groups["infra"] if r.rollout_id in infra.members) == [2, 3]
    assert {r.outcome for r in groups["infra"] if r.sample_index < 2} == {"infra_error"}
    short = next(r.group for r in groups["short"] if r.group_complete)
    assert short.status == "short" and len(short.members) == 1
    assert "1 of 2 usable" in short.reason and "3 sample(s) ended" in short.reason
    timeouts = next(r.group for r in groups["timeouts"] if r.group_complete)
    assert timeouts.status == "complete" and sorted(
        r.sample_index for r in groups["timeouts"] if r.rollout_id in timeouts.members
    ) == [2, 3]
    assert {(r.outcome, r.reward) for r in groups["timeouts"] if r.sample_index < 2} == {("timeout", 1.0)}
    # the trainer's view: exactly n usable samples per complete group, the short one short
    sdk_groups = {g[0].instance_id: g for g in service.client.groups(job.job_id, wait=1)}
    assert {k: len(v) for k, v in sdk_groups.items()} == {"tail": 2, "infra": 2, "short": 1, "timeouts": 2}
    assert all(r.reward == 1.0 for g in sdk_groups.values() for r in g)
    listed = httpx.get(f"{service.url}/v1/jobs/{job.job_id}/groups").json()["groups"]
    assert {g["instance_id"]: g["status"] for g in listed} == {
        "tail": "complete",
        "infra": "complete",
        "short": "short",
        "timeouts": "complete",
    }


def test_group_deadline_completes_with_what_is_usable(service) -> None:
    instances = [{"instance_id": "slow", "run_s": [0.2, 0.3, 60]}, {"instance_id": "fast", "run_s": [0.2, 0.2, 0.3]}]
    # 8 s: the fast samples finish well before it even on a loaded machine
    job = service.client.submit("test-straggler", instances, n_samples=3, group_timeout=8)
    service.wait_done(job.job_id, timeout=60)
    rows = by_instance(service.all_results(job.job_id))
    slow = next(r.group for r in rows["slow"] if r.group_complete)
    assert slow.status == "short" and len(slow.members) == 2
    assert "deadline (8 s)" in slow.reason and "2 of 3 usable" in slow.reason
    straggler = next(r for r in rows["slow"] if r.sample_index == 2)
    assert (
        straggler.status == "cancelled"
        and straggler.cut_reason.startswith("group deadline")
        and slow.cut == [straggler.rollout_id]
    )
    # the closing row is the straggler, the last of its group to end, after the deadline
    assert straggler.group_complete
    assert 8 <= seconds(slow.started_at, slow.closed_at) < 15
    assert seconds(slow.started_at, straggler.finished_at) < 25  # not its 60 s
    fast = next(r.group for r in rows["fast"] if r.group_complete)
    assert fast.status == "complete" and len(fast.members) == 3 and fast.cut == []


def test_a_cut_aborts_the_generation_in_flight(tmp_path, pg_url, redis_prefix) -> None:
    """A cut sample's request to the inference server is closed (the simulator counts an
    abort), as a cancel's is: the group does not wait for its 30 s answer."""
    # seed 1 draws fast, then slow: one sample answers at once, the other would take 30 s
    script = {"default": ["Done."], "latency_dist": {"kind": "tail", "p": 0.5, "base": 0.1, "slow": 30, "seed": 1}}
    sim, stop_sim = start_simulator(str(BUNDLED_TOKENIZER), script)
    svc = start_service(tmp_path, db_url=pg_url, broker_url=REDIS_URL, key_prefix=redis_prefix)
    try:
        svc.client.add_llm_server(sim)
        job = svc.client.submit("test-chat", [{"instance_id": "one", "turns": 1}], n_samples=1, spare=1)
        svc.wait_done(job.job_id, timeout=60)
        rows = svc.all_results(job.job_id)
        member = next(r for r in rows if not r.cut_reason)
        cut = next(r for r in rows if r.cut_reason)
        record = member.group
        assert seconds(record.started_at, cut.finished_at) < 15  # not the 30 s answer
        assert member.group_complete and member.group.members == [member.rollout_id]
        assert member.response_ids and member.reward is not None
        assert cut.status == "cancelled"
        stats = httpx.get(f"{sim}/sim/stats", timeout=30).json()
        assert stats.get("aborted") == 1, stats
    finally:
        svc.stop()
        stop_sim()


def test_deadline_ends_queued_samples_at_once(tmp_path, pg_url, redis_prefix) -> None:
    """At a deadline, cut samples still queued for INIT end in the closing transaction (no
    worker needed): completion numbers follow on, the last carries group_complete, the job
    completes and its callbacks are queued. No workers run here: the rows stay queued."""
    from datetime import timedelta

    import sqlalchemy as sa

    from core.db import session_scope
    from core.models import Callback, Group, Outcome, Rollout, Status, utcnow
    from tasks.writes import groups, terminal

    svc = start_service(
        tmp_path,
        db_url=pg_url,
        broker_url=REDIS_URL,
        key_prefix=redis_prefix,
        stages=(),
        reaper=False,
        handler_modules="tests.straggler_handlers",
    )
    try:
        job = svc.client.submit(
            "test-straggler",
            [{"instance_id": "q"}],
            n_samples=3,
            group_timeout=60,
            callback_url="http://127.0.0.1:9/hook",
        )
        first, *queued = job.rollout_ids
        with session_scope(pg_url) as s:  # the group started long ago; one sample ended
            s.execute(
                sa.update(Group).values(
                    started_at=utcnow() - timedelta(seconds=90), deadline_at=utcnow() - timedelta(seconds=30)
                )
            )
        assert terminal.finish(
            pg_url,
            first,
            Status.FAILED,
            Outcome.AGENT_ERROR.value,
            expect_status=["pending"],
            reward=0.0,
            error="agent broke",
        )
        assert groups.close_overdue(pg_url) == [(job.job_id, "q")]
        assert groups.close_overdue(pg_url) == []  # closes once
        rows = {r.rollout_id: r for r in svc.all_results(job.job_id)}
        assert [rows[i].seq for i in (first, *queued)] == [1, 2, 3]
        assert all(rows[i].status == "cancelled" and rows[i].cut_reason for i in queued)
        assert rows[queued[-1]].group_complete and not rows[first].group_complete
        record = rows[queued[-1]].group
        assert record.status == "short" and record.members == [first]  # reward 0 counts
        assert sorted(record.cut) == sorted(queued) and "1 of 3 usable" in record.reason
        assert svc.client.job(job.job_id).status == "done"
        with session_scope(pg_url) as s:
            events = sorted(s.scalars(sa.select(Callback.event)).all())
        assert events == ["group", "job"]
        assert svc.client.job(job.job_id).finished == 3
        with session_scope(pg_url) as s:
            assert s.scalar(sa.select(sa.func.count()).select_from(Rollout).where(Rollout.status == "pending")) == 0
    finally:
        svc.stop()
