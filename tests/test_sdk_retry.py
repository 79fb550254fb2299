"""The SDK rides out a gateway restart: capped, jittered backoff up to a total budget (default
>= 10 min), 502/503/504 and lost connections retried, 4xx never; `stream()` reconnects from its
cursor with no duplicates and no gaps. A scripted gateway over real HTTP plays the failures."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from raas_client import RaasClient, RaasHTTPError
from raas_client.retry import DEFAULT_RETRY_TOTAL, RETRY_TOTAL_ENV, Backoff, RetryPolicy, retry_total_from_env


def test_default_budget_is_at_least_ten_minutes_and_env_sets_it(monkeypatch):
    monkeypatch.delenv(RETRY_TOTAL_ENV, raising=False)
    assert DEFAULT_RETRY_TOTAL >= 600
    assert RaasClient().retry.total >= 600
    monkeypatch.setenv(RETRY_TOTAL_ENV, "42.5")
    assert retry_total_from_env() == 42.5 and RaasClient().retry.total == 42.5
    assert RaasClient(retry_total=3).retry.total == 3  # the argument wins
    monkeypatch.setenv(RETRY_TOTAL_ENV, "ten minutes")
    with pytest.raises(ValueError, match="RAAS_RETRY_TOTAL='ten minutes' is not a number"):
        RaasClient()


def test_backoff_doubles_to_the_cap_with_jitter_and_stops_at_the_total():
    now = [0.0]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    backoff = Backoff(RetryPolicy(total=600, first_wait=0.25, max_wait=10), lambda: now[0], sleep)
    while backoff.wait():
        pass
    caps = [min(10, 0.25 * 2**i) for i in range(len(sleeps))]
    assert all(cap / 2 <= s <= cap for s, cap in zip(sleeps[:-1], caps))
    assert max(sleeps) <= 10 and sum(sleeps) == pytest.approx(600)
    assert len(sleeps) > 55  # ten minutes of capped waits, not a handful of doublings
    backoff.reset()
    assert backoff.next_delay() <= 0.25  # a success starts the next run short again


class ScriptedGateway:
    """A real HTTP server answering from a script: each request pops the next answer."""

    def __init__(self, script: list) -> None:
        self.script = script
        self.seen: list[tuple[str, str, dict]] = []
        self.server = make_server("127.0.0.1", 0, self.app, threaded=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def app(self, environ, start_response):
        request = Request(environ)
        self.seen.append((request.method, request.path, dict(request.args)))
        answer = self.script.pop(0)
        return answer(request)(environ, start_response)


def status(code: int, body: dict | None = None):
    return lambda request: Response(
        json.dumps(body or {"message": f"status {code}"}), code, mimetype="application/json"
    )


def ndjson(*lines: str):
    def answer(request):
        def body() -> Iterator[str]:
            yield from lines

        return Response(body(), 200, mimetype="application/x-ndjson")

    return answer


def rollout_row(seq: int, job: str = "j", **fields: Any) -> dict[str, Any]:
    """A finished rollout as the results API sends it (`RolloutView`)."""
    return {
        "rollout_id": f"r{seq}",
        "job_id": job,
        "instance_id": f"i{seq}",
        "sample_index": 0,
        "status": "done",
        "attempt": 1,
        "timing": {},
        "created_at": "2026-01-01T00:00:00Z",
        "seq": seq,
        "outcome": "completed",
        "reward": 1.0,
        **fields,
    }


def job_view(job: str = "j", **fields: Any) -> dict[str, Any]:
    """A job as GET /v1/jobs/{id} sends it (`JobView`)."""
    return {
        "job_id": job,
        "agent": "math",
        "status": "running",
        "n_instances": 1,
        "n_samples": 1,
        "n_rollouts": 1,
        "finished": 0,
        "progress": 0.0,
        "counts": {},
        "outcomes": {},
        "created_at": "2026-01-01T00:00:00Z",
        **fields,
    }


def item(seq: int) -> str:
    return json.dumps(rollout_row(seq)) + "\n"


@pytest.fixture
def client_for():
    made: list = []

    def make(script: list) -> tuple[RaasClient, ScriptedGateway]:
        gw = ScriptedGateway(script)
        client = RaasClient(gw.url, retry_total=20, retry_max_wait=0.05)
        made.append((client, gw))
        return client, gw

    yield make
    for client, gw in made:
        client.close()
        gw.server.shutdown()


def test_reads_retry_5xx_but_never_4xx(client_for):
    page = {"job_id": "j", "items": [], "cursor": 0, "done": True}
    client, gw = client_for(
        [status(503), status(502), status(504), status(200, page), status(404, {"message": "job 'j' not found"})]
    )
    assert client.results_page("j").model_dump(exclude_unset=True) == page
    assert len(gw.seen) == 4
    with pytest.raises(RaasHTTPError, match="HTTP 404: job 'j' not found"):
        client.job("j")
    assert len(gw.seen) == 5 and not gw.script  # the 404 was asked once


def test_submit_retries_only_with_an_idempotency_key(client_for):
    accepted = {"job_id": "j", "rollout_ids": ["r1"], "created": True}
    client, gw = client_for([status(503), status(503), status(202, accepted), status(503)])
    rows = [{"instance_id": "a"}]
    assert client.submit("math", rows, idempotency_key="k").model_dump() == accepted
    with pytest.raises(RaasHTTPError, match="HTTP 503"):  # no key: sent once
        client.submit("math", rows)
    assert len(gw.seen) == 4


def test_reads_give_up_after_the_total_budget():
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    client = RaasClient(f"http://127.0.0.1:{port}", retry_total=1.0, retry_max_wait=0.2)
    started = time.monotonic()
    with pytest.raises(httpx.ConnectError):
        client.job("j")
    assert 1.0 <= time.monotonic() - started < 3.0
    client.close()


def test_stream_resumes_from_its_cursor_without_duplicates_or_gaps(client_for):
    done = {"job_id": "j", "items": [], "cursor": 5, "done": True}
    not_done = {"job_id": "j", "items": [], "cursor": 4, "done": False}
    client, gw = client_for(
        [
            ndjson(item(1), item(2), item(3)[:20]),  # the gateway died mid-line
            status(503),  # restarting
            ndjson(item(2), item(3), item(4)),  # a replayed line (2) is skipped
            status(200, not_done),  # idle wait passed: not done, so reconnect
            ndjson(item(5)),
            status(200, done),
        ]
    )
    got = [r.seq for r in client.stream("j", wait=5)]
    assert got == [1, 2, 3, 4, 5]
    streams = [args["after"] for method, path, args in gw.seen if args.get("format")]
    assert streams == ["0", "2", "2", "4"]
    assert not gw.script


def test_stream_raises_a_4xx_at_once(client_for):
    client, gw = client_for([status(404, {"message": "job 'j' not found"})])
    with pytest.raises(RaasHTTPError, match="404"):
        list(client.stream("j"))
    assert len(gw.seen) == 1
