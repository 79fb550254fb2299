"""The server pool over several LLM simulators: balance, stickiness, failover, weight swaps."""

from __future__ import annotations

import threading
from collections import Counter

import httpx
import pytest
from sqlalchemy import select

from agents.llm import LLMSession
from core.db import session_scope
from core.errors import LeaseLost
from core.models import Job, LLMServer, Rollout
from tasks.llm.llm_pool import RegisteredPool, make_pool, reconcile_in_flight
from tests.llm.conftest import SMOLLM2, deadline

SCRIPT = {"default": ['<tool_call>{"name": "step", "arguments": {}}</tool_call>']}
SPEC = {"tokenizer": SMOLLM2, "max_model_len": 2048}
LEASE = "test-node/1/lease"  # the stage lease the rollouts below are held under


def register(db_url: str, urls: list[str], version: str = "v1") -> None:
    with session_scope(db_url) as db:
        for url in urls:
            db.add(LLMServer(url=url, model=SMOLLM2, weight_version=version))


def servers(db_url: str) -> dict[str, LLMServer]:
    with session_scope(db_url) as db:
        return {r.url: r for r in db.scalars(select(LLMServer)).all()}


def make_rollouts(db_url: str, n: int) -> list[str]:
    with session_scope(db_url) as db:
        job = Job(agent="test")
        db.add(job)
        db.flush()
        rows = [Rollout(job_id=job.id, instance_id=f"i{i}", status="run", lease_owner=LEASE) for i in range(n)]
        db.add_all(rows)
        db.flush()
        return [r.id for r in rows]


def sticky(db_url: str, rollout_id: str) -> str | None:
    with session_scope(db_url) as db:
        return db.scalar(select(Rollout.llm_server).where(Rollout.id == rollout_id))


def open_session(
    spec: dict, rollout_id: str, db_url: str, sampling: dict | None = None, lease: str = LEASE
) -> LLMSession:
    """A session on the pipeline's pool for a leased rollout (as the RUN stage opens it)."""
    return LLMSession.open(spec, sampling or {}, rollout_id, make_pool(spec, db_url, rollout_id, lease))


def requests_seen(url: str) -> int:
    return httpx.get(f"{url}/sim/stats").json().get("requests", 0)


def run_turn(s: LLMSession) -> None:
    s.generate(deadline())
    s.append_messages([{"role": "tool", "content": "ok"}])


def test_registered_pool_balances_and_sticks(simulators, db_url) -> None:
    urls = [simulators(SCRIPT)[0] for _ in range(3)]
    register(db_url, urls)
    ids = make_rollouts(db_url, 6)
    sessions = [open_session(SPEC, rid, db_url) for rid in ids]
    for s in sessions:
        s.start([{"role": "user", "content": "go"}])
    for _ in range(3):
        for s in sessions:
            run_turn(s)
    assert sorted(r.in_flight for r in servers(db_url).values()) == [2, 2, 2]
    assert [requests_seen(u) for u in urls] == [6, 6, 6]  # 2 rollouts x 3 turns each
    for rid, s in zip(ids, sessions):
        assert sticky(db_url, rid) == s.server.url  # every turn on the same server
    for s in sessions:
        s.close()
        s.close()  # idempotent
    assert [r.in_flight for r in servers(db_url).values()] == [0, 0, 0]


def test_concurrent_claims_are_exact(any_db_url) -> None:
    """64 workers claim at once: every claim succeeds (no false "no server") and the counts
    are exactly what was handed out, spread evenly."""
    from migrations.runner import upgrade

    upgrade(any_db_url)
    register(any_db_url, [f"http://127.0.0.1:{9 + i}" for i in range(4)])
    pool = RegisteredPool(any_db_url, "vllm", "no-rollout", LEASE)
    barrier = threading.Barrier(64)
    claimed: list[str] = []
    errors: list[BaseException] = []

    def claim() -> None:
        barrier.wait()
        try:
            claimed.append(pool.acquire().url)
        except BaseException as exc:  # noqa: BLE001 - the test reports every failure
            errors.append(exc)

    threads = [threading.Thread(target=claim) for _ in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    rows = servers(any_db_url)
    assert {url: r.in_flight for url, r in rows.items()} == Counter(claimed)
    assert sorted(r.in_flight for r in rows.values()) == [16, 16, 16, 16]
    for url in claimed[:10]:
        pool.release(url)
    assert sum(r.in_flight for r in servers(any_db_url).values()) == 54
    reconcile_in_flight(any_db_url)  # no rollout sticks to them: all slots were leaked
    assert [r.in_flight for r in servers(any_db_url).values()] == [0, 0, 0, 0]


def test_killed_server_mid_job_fails_over(simulators, db_url) -> None:
    started = [simulators(SCRIPT) for _ in range(3)]
    urls = [u for u, _ in started]
    register(db_url, urls)
    ids = make_rollouts(db_url, 6)
    sessions = [open_session(SPEC, rid, db_url) for rid in ids]
    for s in sessions:
        s.start([{"role": "user", "content": "go"}])
        run_turn(s)
    victim, kill = started[1]
    on_victim = [s for s in sessions if s.server.url == victim]
    assert len(on_victim) == 2
    kill()  # mid-job: every rollout has one turn done
    for _ in range(2):
        for s in sessions:
            run_turn(s)
    rows = servers(db_url)
    assert rows[victim].healthy is False and rows[victim].last_error
    for rid, s in zip(ids, sessions):
        traj = s.trajectory()
        assert len(traj.turn_boundaries) == 3 and traj.policy_versions == ["v1"] * 3
        assert s.audit_drift()["retokenization_drift"] == 0
        assert s.server.url != victim and sticky(db_url, rid) == s.server.url
    for s in sessions:
        s.close()
    assert all(r.in_flight == 0 for r in servers(db_url).values())


def test_job_servers_fail_over(simulators, db_url) -> None:
    (url_a, kill_a), (url_b, _) = simulators(SCRIPT), simulators(SCRIPT)
    spec = {**SPEC, "servers": [{"url": url_a, "weight_version": "a"}, {"url": url_b, "weight_version": "b"}]}
    ids = make_rollouts(db_url, 2)
    sessions = [open_session(spec, rid, db_url) for rid in ids]
    for s in sessions:
        s.start([{"role": "user", "content": "go"}])
        run_turn(s)
    assert {s.server.url for s in sessions} == {url_a, url_b}
    kill_a()
    for s in sessions:
        run_turn(s)
    assert {s.server.url for s in sessions} == {url_b}
    moved = next(s for s in sessions if s.trajectory().policy_versions[0] == "a")
    assert moved.trajectory().policy_versions == ["a", "b"]
    for s in sessions:
        s.close()


def test_weight_swap_by_re_registering(simulators, db_url) -> None:
    url, _ = simulators(SCRIPT)
    register(db_url, [url], "step-1")
    (rid,) = make_rollouts(db_url, 1)
    s = open_session(SPEC, rid, db_url)
    s.start([{"role": "user", "content": "go"}])
    run_turn(s)
    with session_scope(db_url) as db:  # the trainer clears the pool and re-adds new weights
        db.execute(LLMServer.__table__.delete())
    register(db_url, [url], "step-2")
    run_turn(s)
    assert s.trajectory().policy_versions == ["step-1", "step-2"]
    s.close()
    assert servers(db_url)[url].in_flight == 0


def test_down_server_comes_back_after_probe(simulators, db_url, monkeypatch) -> None:
    import tasks.llm.llm_pool as pool_module

    monkeypatch.setattr(pool_module, "RECHECK_SECONDS", 0.0)
    url, _ = simulators(SCRIPT)
    register(db_url, [url])
    pool = RegisteredPool(db_url, "vllm", "no-rollout", LEASE)
    pool.mark_down(url, "simulated failure")
    assert servers(db_url)[url].healthy is False
    assert pool.acquire().url == url  # the probe found it healthy again
    assert servers(db_url)[url].healthy is True and servers(db_url)[url].last_error is None


def test_retried_attempt_returns_to_its_server_and_health_sweep(simulators, db_url) -> None:
    from tasks.llm.llm_pool import check_health

    (url_a, kill_a), (url_b, _) = simulators(SCRIPT), simulators(SCRIPT)
    register(db_url, [url_a, url_b])
    (rid,) = make_rollouts(db_url, 1)
    first = open_session(SPEC, rid, db_url)
    first.start([{"role": "user", "content": "go"}])
    run_turn(first)
    used = first.server.url
    first.close()  # the worker's attempt ends; a retry opens a new session for the same rollout
    with session_scope(db_url) as db:  # make the other server the least loaded one
        db.execute(LLMServer.__table__.update().where(LLMServer.url == used).values(in_flight=5))
    again = open_session(SPEC, rid, db_url)
    again.start([{"role": "user", "content": "go"}])
    run_turn(again)
    assert again.server.url == used == sticky(db_url, rid)  # stickiness beats load
    again.close()
    kill_a()
    assert check_health(db_url)[url_a] is not None and check_health(db_url)[url_b] is None
    assert servers(db_url)[url_a].healthy is False and servers(db_url)[url_b].healthy is True


def test_sticking_is_fenced_on_the_lease(simulators, db_url) -> None:
    """A worker that lost its rollout (the reaper gave it to a new attempt) writes nothing."""
    url, _ = simulators(SCRIPT)
    register(db_url, [url])
    (rid,) = make_rollouts(db_url, 1)
    with open_session(SPEC, rid, db_url, lease="someone-else/2/old") as s:
        s.start([{"role": "user", "content": "go"}])
        with pytest.raises(LeaseLost, match="lost"):
            s.generate(deadline())
    assert sticky(db_url, rid) is None
    with open_session(SPEC, rid, db_url) as s:  # the lease holder's write lands
        s.start([{"role": "user", "content": "go"}])
        run_turn(s)
    assert sticky(db_url, rid) == url


def test_the_claimed_rows_server_is_not_read_again(simulators, db_url, monkeypatch) -> None:
    """RUN hands its pool the row its claim returned: the sticky server comes from it (no
    read per rollout) and from this pool's own `stick` after; a pool told nothing reads it."""
    from types import SimpleNamespace

    from tasks.llm import llm_pool_sql

    (url_a, _), (url_b, _) = simulators(SCRIPT), simulators(SCRIPT)
    register(db_url, [url_a, url_b])
    (rid,) = make_rollouts(db_url, 1)
    with session_scope(db_url) as db:  # a resumed RUN: the row already sticks to url_b
        db.execute(Rollout.__table__.update().where(Rollout.id == rid).values(llm_server=url_b))
    reads = []
    run_alone = llm_pool_sql.run_alone

    def counting(db, statement, params):
        reads.append(statement is llm_pool_sql.STICKY_URL)
        return run_alone(db, statement, params)

    monkeypatch.setattr(llm_pool_sql, "run_alone", counting)
    told = make_pool(SPEC, db_url, rid, LEASE, claimed=SimpleNamespace(llm_server=url_b))
    assert told.sticky_url() == url_b and not any(reads)
    told.stick(url_a)
    assert told.sticky_url() == url_a == sticky(db_url, rid) and not any(reads)
    with LLMSession.open(
        SPEC, {}, rid, make_pool(SPEC, db_url, rid, LEASE, claimed=SimpleNamespace(llm_server=url_a))
    ) as s:
        s.start([{"role": "user", "content": "go"}])
        run_turn(s)
        assert s.server.url == url_a and not any(reads)
    untold = make_pool(SPEC, db_url, rid, LEASE)
    assert untold.sticky_url() == url_a and reads.count(True) == 1


@pytest.mark.parametrize("routing", ["round_robin", "least_loaded"])
def test_per_turn_routing_releases_and_picks_again(simulators, db_url, routing) -> None:
    """`llm_routing` round_robin / least_loaded (the routing bench's baselines): a turn holds a
    slot only while it generates, the next turn picks again, nothing sticks."""
    urls = [simulators(SCRIPT)[0] for _ in range(3)]
    register(db_url, urls)
    rid = make_rollouts(db_url, 1)[0]
    session = LLMSession.open(SPEC, {}, rid, make_pool(SPEC, db_url, rid, LEASE, routing=routing))
    held = make_rollouts(db_url, 1)[0]
    holder = make_pool(SPEC, db_url, held, LEASE)  # a sticky rollout holding a slot elsewhere
    taken = holder.acquire().url
    session.start([{"role": "user", "content": "go"}])
    for _ in range(6):
        run_turn(session)
        assert session.server is None
        assert {u: r.in_flight for u, r in servers(db_url).items()} == {
            u: int(u == taken) for u in urls
        }  # only the holder's slot is still counted
    seen = {u: requests_seen(u) for u in urls}
    if routing == "round_robin":
        assert sorted(seen.values()) == [2, 2, 2], seen  # every server in turn
    else:
        assert seen[taken] == 0 and sum(seen.values()) == 6, seen  # never the busier one
    assert sticky(db_url, rid) is None
    session.close()
