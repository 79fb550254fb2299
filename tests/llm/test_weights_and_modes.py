"""Weight updates without restarts and logprob modes (issue 12, cases 7-8), on the simulator.

The trainer's side is the database row (what PUT /v1/llm-servers writes): pausing a server
makes a turn wait instead of failing, resuming with a new weight_version is recorded on the
next turn; a server's declared --logprobs-mode is recorded and can be required by a job.
"""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import update

from agents.llm import LLMSession, validate_llm_spec
from agents.llm.pool import RECHECK_SECONDS, ServersPaused
from core.db import session_scope
from core.errors import ConfigError, InvalidRequest
from core.models import LLMServer
from tasks.llm.llm_pool import RegisteredPool
from tests.llm.conftest import SMOLLM2, deadline
from tests.waiting import wait_for
from tests.llm.test_pool import (
    LEASE,
    SCRIPT,
    SPEC,
    make_rollouts,
    open_session,
    register,
    requests_seen,
)


def set_row(db_url: str, url: str, **values) -> None:
    with session_scope(db_url) as db:
        db.execute(update(LLMServer).where(LLMServer.url == url).values(**values))


def test_paused_server_makes_the_turn_wait_then_records_the_new_version(simulators, db_url) -> None:
    url, _ = simulators(SCRIPT)
    register(db_url, [url], "v1")
    [rid] = make_rollouts(db_url, 1)
    with open_session(SPEC, rid, db_url) as s:
        s.start([{"role": "user", "content": "go"}])
        assert s.generate(deadline()).weight_version == "v1"
        s.append_messages([{"role": "tool", "content": "ok"}])
        set_row(db_url, url, paused=True)  # PUT {"paused": true}
        seen = requests_seen(url)
        threading.Timer(1.5, set_row, args=(db_url, url), kwargs={"paused": False, "weight_version": "v2"}).start()
        started = time.monotonic()
        second = s.generate(deadline())
        assert time.monotonic() - started >= 1.4  # waited for the resume, did not fail
        assert requests_seen(url) == seen + 1  # nothing was sent while paused
        assert second.weight_version == "v2"
        assert s.trajectory().policy_versions == ["v1", "v2"]


def test_waiting_on_a_pause_is_not_charged_to_the_deadline(simulators, db_url) -> None:
    """A pause longer than the time left: the turn waits (no timeout, no failover), the
    deadline moves on by the wait, the rollout row counts it, and a cancel still stops it.

    Load-proof: the time left is a few times what a turn takes on this machine right now, and
    the resume comes only once the rollout row shows that the turn has waited longer than that
    (not after a fixed delay that a slow start could eat into)."""
    from core.errors import RolloutCancelled
    from core.models import Rollout

    url, _ = simulators(SCRIPT)
    register(db_url, [url], "v1")
    [rid0, rid, rid2] = make_rollouts(db_url, 3)
    with open_session(SPEC, rid0, db_url) as s:  # a turn's time here and now, unpaused
        s.start([{"role": "user", "content": "go"}])
        started = time.monotonic()
        s.generate(deadline())
        time_left = max(0.5, 3 * (time.monotonic() - started))
    set_row(db_url, url, paused=True)

    def paused_seconds() -> float:
        with session_scope(db_url) as db:
            return db.get(Rollout, rid).paused_seconds or 0.0

    def resume_once_waited_past_the_deadline() -> None:
        try:
            wait_for(lambda: paused_seconds() > time_left, 60, "the turn's pause to pass its time left", 0.05)
        finally:
            set_row(db_url, url, paused=False, weight_version="v2")

    resume = threading.Thread(target=resume_once_waited_past_the_deadline)
    with open_session(SPEC, rid, db_url) as s:
        s.start([{"role": "user", "content": "go"}])
        resume.start()
        started = time.monotonic()
        gen = s.generate(time.monotonic() + time_left)  # paused for longer than time_left
        took = time.monotonic() - started
    resume.join()
    assert gen.weight_version == "v2" and gen.token_ids
    assert time_left < gen.paused_seconds <= took, (time_left, gen.paused_seconds, took)
    with session_scope(db_url) as db:
        row = db.get(Rollout, rid)
        assert row.paused_seconds == pytest.approx(gen.paused_seconds) and row.generating_on is None
    set_row(db_url, url, paused=True)
    cancelled = threading.Event()
    threading.Timer(0.6, cancelled.set).start()
    with open_session(SPEC, rid2, db_url) as s:
        s.start([{"role": "user", "content": "go"}])
        with pytest.raises(RolloutCancelled):
            s.generate(time.monotonic() + 0.2, cancelled.is_set)
    assert requests_seen(url) == 2  # the measuring turn and the resumed one


def test_pool_skips_paused_servers_and_says_when_all_are(simulators, db_url) -> None:
    a, b = simulators(SCRIPT)[0], simulators(SCRIPT)[0]
    register(db_url, [a, b])
    set_row(db_url, a, paused=True)
    pool = RegisteredPool(db_url, "vllm", "no-rollout", LEASE)
    assert pool.acquire().url == b
    set_row(db_url, b, paused=True)
    with pytest.raises(ServersPaused):
        pool.acquire()


def test_logprobs_mode_is_recorded_per_turn(simulators, db_url) -> None:
    url, _ = simulators(SCRIPT)
    spec = {
        "servers": [{"url": url, "logprobs_mode": "processed_logprobs"}],
        "tokenizer": SMOLLM2,
        "max_model_len": 2048,
        "logprobs_mode": "processed_logprobs",
    }
    with LLMSession.open(spec, {}, "modes-1") as s:
        s.start([{"role": "user", "content": "go"}])
        assert s.generate(deadline()).logprobs_mode == "processed_logprobs"
        assert s.logprobs_mode == "processed_logprobs"


def test_logprobs_mode_mismatch_is_refused(simulators, db_url) -> None:
    url, _ = simulators(SCRIPT)
    with pytest.raises(InvalidRequest, match=r"llm.servers.0.logprobs_mode"):
        validate_llm_spec({"servers": [{"url": url}], "tokenizer": SMOLLM2, "logprobs_mode": "processed_logprobs"})
    register(db_url, [url])  # declares vLLM's default, raw_logprobs
    [rid] = make_rollouts(db_url, 1)
    with open_session({**SPEC, "logprobs_mode": "processed_logprobs"}, rid, db_url) as s:
        s.start([{"role": "user", "content": "go"}])
        with pytest.raises(ConfigError, match="processed_logprobs"):
            s.generate(deadline())


def test_request_failing_while_paused_waits_instead_of_failing_over(db_url) -> None:
    """The trainer pauses and restarts the server with a request in flight: no mark-down."""
    import threading as th

    from fakellm.server import make_server, start_simulator

    slow = {"default": [SCRIPT["default"][0], {"text": "slow", "latency": 3.0}]}
    url, stop_a = start_simulator(SMOLLM2, slow)
    register(db_url, [url], "v1")
    [rid] = make_rollouts(db_url, 1)
    port = int(url.rsplit(":", 1)[1])
    servers = []

    def trainer() -> None:
        time.sleep(0.2)
        set_row(db_url, url, paused=True)
        stop_a()  # the old weights' server goes away mid-request
        server_b = make_server(SMOLLM2, {"default": ["new weights"]}, port=port)
        servers.append(server_b)
        th.Thread(target=server_b.serve_forever, daemon=True).start()
        time.sleep(1.0)
        set_row(db_url, url, paused=False, weight_version="v2")

    with open_session({**SPEC, "request_timeout": 0.6}, rid, db_url) as s:
        s.start([{"role": "user", "content": "go"}])
        s.generate(deadline())
        s.append_messages([{"role": "tool", "content": "ok"}])
        worker = th.Thread(target=trainer)
        worker.start()
        started = time.monotonic()
        try:
            second = s.generate(deadline())
        finally:
            worker.join()
            for server in servers:
                server.shutdown()
                server.server_close()
    elapsed = time.monotonic() - started
    assert (second.text, second.weight_version) == ("new weights", "v2")
    # Answered right after the resume, not after a mark-down and a re-probe (RECHECK_SECONDS).
    assert elapsed < RECHECK_SECONDS
    with session_scope(db_url) as db:
        row = db.query(LLMServer).filter_by(url=url).one()
        assert row.healthy and row.checked_at is None  # never marked down
