"""Push through the real pipeline: signed job callbacks (retried, outside the pipeline), the
server-sent event stream (resumable), and job priority (a high-priority job overtakes a
backlog) on Redis and on the embedded broker."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from raas_client.sdk import verify_callback
from core.errors import InvalidRequest
from core.policy import Policy, check_callback_url
from tests.conftest import REDIS_URL
from bench.support.pipeline_harness import start_service, wait_for
from raas_client.event_models import RolloutEvent
from raas_client.models import GroupView, JobView

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`


class Receiver(ThreadingHTTPServer):
    """A trainer's callback endpoint on loopback: answers 500 to the first `fail_first`
    deliveries, then 200; keeps every request (headers and raw body)."""

    daemon_threads = True

    def __init__(self, fail_first: int = 0) -> None:
        self.calls: list[tuple[dict[str, str], bytes, int]] = []
        self.fail_first = fail_first
        super().__init__(("127.0.0.1", 0), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}/hook"


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        status = 500 if len(self.server.calls) < self.server.fail_first else 200
        self.server.calls.append((dict(self.headers), body, status))
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args) -> None:  # quiet
        pass


@pytest.fixture
def service(tmp_path, pg_url, redis_prefix):
    svc = start_service(
        tmp_path, db_url=pg_url, broker_url=REDIS_URL, key_prefix=redis_prefix, extra={"callback_interval": 0.2}
    )
    yield svc
    svc.stop()


def test_callbacks_are_signed_retried_and_complete(service) -> None:
    receiver = Receiver(fail_first=1)
    try:
        job = service.client.submit(
            "test-sleepy", [{"instance_id": f"i{k}"} for k in range(2)], n_samples=2, callback_url=receiver.url
        )
        service.wait_done(job.job_id)
        delivered = wait_for(
            lambda: (
                [c for c in receiver.calls if c[2] == 200] if sum(c[2] == 200 for c in receiver.calls) >= 3 else None
            ),
            timeout=20,
            what="3 delivered callbacks",
        )
    finally:
        receiver.shutdown()
    secret = service.client.callback_secret()
    events = []
    for headers, body, _ in delivered:
        assert verify_callback(secret, body, headers["X-Raas-Signature"])
        assert not verify_callback(secret, body + b" ", headers["X-Raas-Signature"])
        events.append(json.loads(body))
    assert sorted(e["event"] for e in events) == ["group", "group", "job"]
    assert {e["job_id"] for e in events} == {job.job_id}
    assert sorted(e["group"]["instance_id"] for e in events if e["event"] == "group") == ["i0", "i1"]
    assert all(len(e["group"]["members"]) == 2 for e in events if e["event"] == "group")
    # the failed first delivery was retried under the same delivery id
    first = receiver.calls[0]
    assert first[2] == 500
    assert [c[0]["X-Raas-Delivery"] for c in receiver.calls].count(first[0]["X-Raas-Delivery"]) == 2
    # another owner's secret does not verify
    assert not verify_callback("0" * 64, delivered[0][1], delivered[0][0]["X-Raas-Signature"])


def test_callback_urls_follow_the_operator_allowlist() -> None:
    policy = Policy(callback_urls=["https://trainer.example/hooks"])
    check_callback_url(policy, "https://trainer.example/hooks/step", admin=False, field="callback_url")
    check_callback_url(policy, "http://10.0.0.1/x", admin=True, field="callback_url")
    with pytest.raises(InvalidRequest) as err:
        check_callback_url(policy, "http://127.0.0.1:6379/", admin=False, field="callback_url")
    assert err.value.details["field"] == "callback_url" and "not allowed" in err.value.message


def test_event_stream_reports_progress_and_resumes(service) -> None:
    job = service.client.submit(
        "test-sleepy", [{"instance_id": f"i{k}"} for k in range(3)], n_samples=2, agent_config={"run_s": 0.2}
    )
    events = list(service.client.events(job.job_id, wait=30))
    kinds = [e.event for e in events]
    assert kinds.count("rollout") == 6 and kinds.count("group") == 3 and kinds[-1] == "job"
    rollouts = [e for e in events if e.event == "rollout"]
    assert [e.id for e in rollouts] == list(range(1, 7))
    assert all(isinstance(e.data, RolloutEvent) and e.data.reward in (0.0, 1.0) for e in rollouts)
    assert all(isinstance(e.data, GroupView) for e in events if e.event == "group")
    last = events[-1].data
    assert isinstance(last, JobView) and last.status == "done" and last.finished == 6
    # a reconnect with Last-Event-ID 3 gets exactly what followed seq 3
    resumed = list(service.client.events(job.job_id, after=3, wait=5))
    assert [e.id for e in resumed if e.event == "rollout"] == [4, 5, 6]
    assert [e for e in events if e.id > 3] == resumed


@pytest.mark.parametrize("backend", ["redis+postgresql", "embedded"])
def test_a_high_priority_job_overtakes_a_backlog(backend, tmp_path, request) -> None:
    kwargs = {}
    if backend != "embedded":
        kwargs = {
            "db_url": request.getfixturevalue("pg_url"),
            "broker_url": REDIS_URL,
            "key_prefix": request.getfixturevalue("redis_prefix"),
        }
    svc = start_service(tmp_path, concurrency={"init": 1, "run": 4, "eval": 4}, **kwargs)
    try:
        backlog = svc.client.submit(
            "test-sleepy", [{"instance_id": f"b{k}"} for k in range(30)], agent_config={"init_s": 1.0}
        )
        wait_for(
            lambda: svc.client.job(backlog.job_id).finished >= 2, timeout=120, what="the backlog to start"
        )  # worker start-up is slow on a loaded machine
        urgent = svc.client.submit(
            "test-sleepy", [{"instance_id": f"u{k}"} for k in range(3)], agent_config={"init_s": 1.0}, priority=9
        )
        assert svc.client.job(urgent.job_id).priority == 9
        svc.wait_done(urgent.job_id, timeout=60)
        behind = svc.client.job(backlog.job_id)
        # without priorities the urgent job waits for the whole backlog (30 s of INIT on one
        # slot: the same test with priority 0 finds all 30 done); with them it waits only for
        # the backlog messages the INIT pool had already taken
        assert behind.finished <= 15, behind
        svc.client.cancel(backlog.job_id)
    finally:
        svc.stop()
