"""The process's shared HTTP client for inference servers: reuse, abort, cookies, fork."""

from __future__ import annotations

import http.server
import os
import socket
import threading
import time

import httpx
import pytest

from agents.llm import LLMSession
from agents.llm.backends import http_client
from agents.llm.backends.abort import RecordingBackend
from core.errors import RolloutCancelled
from tests.llm.conftest import SMOLLM2, deadline

PROMPT = [{"role": "user", "content": "go"}]


def test_turns_share_one_connection_and_a_cancel_still_cuts_it(simulators, monkeypatch) -> None:
    """Every call of a session (model list, turns) reuses one pooled connection, and a cancel
    mid-turn shuts that reused connection down: the server sees the client go and aborts."""
    connects = []
    original = RecordingBackend.connect_tcp

    def counting(self, host, port, *args, **kwargs):
        connects.append(port)
        return original(self, host, port, *args, **kwargs)

    monkeypatch.setattr(RecordingBackend, "connect_tcp", counting)
    url, _ = simulators({"default": ["quick", {"text": "slow", "latency": 30}]})
    flip_at = [float("inf")]
    with LLMSession.open({"servers": [{"url": url}], "tokenizer": SMOLLM2}, {"max_tokens": 20}, "r-reuse") as s:
        s.start(PROMPT)
        assert s.generate(deadline(), cancelled=lambda: False).text == "quick"
        s.append_messages([{"role": "user", "content": "again"}])
        flip_at[0] = time.monotonic() + 0.5
        started = time.monotonic()
        with pytest.raises(RolloutCancelled):
            s.generate(deadline(60), cancelled=lambda: time.monotonic() >= flip_at[0])
        assert time.monotonic() - started < 3  # not the 30 s the turn would take
    port = int(url.rsplit(":", 1)[1])
    assert connects.count(port) == 1  # GET /v1/models and both turns: one connection
    stats = {}
    for _ in range(40):
        stats = httpx.get(f"{url}/sim/stats").json()
        if stats.get("aborted"):
            break
        time.sleep(0.05)
    assert stats.get("aborted") == 1 and stats.get("requests") == 1


def test_a_forked_child_builds_its_own_client(simulators) -> None:
    """After fork the child must not share the parent's sockets: it gets a new client."""
    url, _ = simulators({"default": ["x"]})
    parent = http_client.shared_client()
    assert parent.get(f"{url}/health").is_success  # a pooled connection in the parent
    pid = os.fork()
    if pid == 0:  # the child: only what is needed, then leave without pytest's teardown
        ok = http_client.shared_client() is not parent
        ok = ok and http_client.shared_client().get(f"{url}/health").is_success
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert http_client.shared_client() is parent and parent.get(f"{url}/health").is_success


def test_configure_rejects_a_pool_for_no_slots() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        http_client.configure(0)


class _Recording(http.server.BaseHTTPRequestHandler):
    """Records each request's path, Host and Cookie; `/bounce` redirects, the rest set a cookie."""

    protocol_version = "HTTP/1.1"
    seen: list = []

    def do_GET(self):
        type(self).seen.append((self.path, self.headers.get("Host"), self.headers.get("Cookie")))
        self.send_response(302 if self.path == "/bounce" else 200)
        if self.path == "/bounce":
            self.send_header("Location", "/elsewhere")
        self.send_header("Set-Cookie", "session=tenant-a-secret; Path=/")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


class _V6Server(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6


def _serve(server_class, address):
    _Recording.seen = []
    server = server_class(address, _Recording)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_cookies_set_by_a_server_are_never_sent_back() -> None:
    """One client serves every job: a Set-Cookie from one answer must not ride on later ones."""
    server = _serve(http.server.ThreadingHTTPServer, ("127.0.0.1", 0))
    try:
        client = http_client.make_client()
        for _ in range(3):
            assert client.get(f"http://127.0.0.1:{server.server_port}/v1/models").is_success
        assert [cookie for _, _, cookie in _Recording.seen] == [None] * 3 and not client.cookies
        client.close()
    finally:
        server.shutdown()


def test_generation_calls_keep_no_cookies_and_follow_no_redirects() -> None:
    """The generation path (`ServerClient.call`, straight on the pools) keeps the shared
    client's rules: a Set-Cookie is never sent back and a redirect is an answer, not a hop."""
    server = _serve(http.server.ThreadingHTTPServer, ("127.0.0.1", 0))
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        client = http_client.make_client()
        for _ in range(3):
            assert client.call("GET", f"{base}/v1/models", None, 5.0).status == 200
        bounced = client.call("GET", f"{base}/bounce", None, 5.0)
        assert bounced.status == 302 and bounced.content == b"{}"
        assert [cookie for _, _, cookie in _Recording.seen] == [None] * 4
        assert [path for path, _, _ in _Recording.seen] == ["/v1/models"] * 3 + ["/bounce"]
        client.close()
    finally:
        server.shutdown()


def test_an_ipv6_server_gets_its_bracketed_host_header() -> None:
    """`Host: [::1]:port`, as the URL writes it (httpcore's own header would be `::1:port`)."""
    try:
        server = _serve(_V6Server, ("::1", 0))
    except OSError as exc:  # a machine without IPv6 loopback
        pytest.skip(f"no IPv6 loopback: {exc}")
    try:
        client = http_client.make_client()
        assert client.call("GET", f"http://[::1]:{server.server_port}/health", None, 5.0).status == 200
        assert _Recording.seen[0][1] == f"[::1]:{server.server_port}"
        client.close()
    finally:
        server.shutdown()


def test_an_unreachable_server_is_a_transport_error() -> None:
    """No HTTP answer raises one of TRANSPORT_ERRORS (the backend's ServerError path)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    client = http_client.make_client()
    with pytest.raises(http_client.TRANSPORT_ERRORS):
        client.call("POST", f"http://127.0.0.1:{port}/v1/completions", b"{}", 2.0)
    client.close()
