"""The generation calls' HTTP/1.1 exchange (`backends/http11.py`) against servers that answer
on a real socket exactly as the test writes: every way a response can end, a dead pooled
connection, what is not HTTP, a header that would smuggle another."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpcore
import httpx
import pytest

from agents.llm.backends import http_client
from agents.llm.backends.abort import RecordingBackend
from agents.llm.backends.http11 import request_bytes


class RawServer:
    """A TCP server on 127.0.0.1 whose connections are handled by `answer(conn, request_no)`."""

    def __init__(self, answer: Callable[[socket.socket, int], None], tls: Any = None) -> None:
        self.tls = tls  # an ssl.SSLContext: the connections speak TLS
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except OSError:  # the client refused the certificate
                conn.close()
                return
        with conn:
            while True:
                request = read_request(conn)
                if not request:
                    return
                self.requests.append(request)
                if self.answer(conn, len(self.requests)) is False:
                    return

    def close(self) -> None:
        self.sock.close()


def read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
    )
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


@pytest.fixture
def serve() -> Iterator[Callable[..., RawServer]]:
    servers: list[RawServer] = []

    def start(answer: Callable[[socket.socket, int], None], tls: Any = None) -> RawServer:
        servers.append(RawServer(answer, tls))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def client() -> Iterator[http_client.ServerClient]:
    c = http_client.make_client(4)
    yield c
    c.close()


def ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def test_keep_alive_reuses_one_connection_for_calls_and_httpx_requests(serve, client) -> None:
    server = serve(lambda conn, n: conn.sendall(ok(b'{"n": %d}' % n)))
    assert client.call("POST", server.url + "/v1/completions", b"{}", 5).content == b'{"n": 1}'
    assert client.get(server.url + "/v1/models").json() == {"n": 2}  # httpx's way in, same lane
    assert client.call("GET", server.url + "/health", None, 5).status == 200
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /v1/completions HTTP/1.1\r\n") and first.endswith(b"\r\n\r\n{}")
    assert b"Content-Length: 2\r\n" in first and b"Host: 127.0.0.1:" in first


def test_a_head_request_reads_no_body_whatever_the_length_says(serve, client) -> None:
    server = serve(lambda conn, n: conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"))
    response = client.head(server.url + "/health", timeout=5)  # would wait for 1000 bytes
    assert response.status_code == 200 and response.content == b""


def test_interim_responses_are_skipped_for_the_final_one(serve, client) -> None:
    def answer(conn: socket.socket, n: int) -> None:
        conn.sendall(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n")
        time.sleep(0.05)  # the final answer in a later read
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b'{"n": %d}' % n))

    server = serve(answer)
    reply = client.call("POST", server.url + "/v1/completions", b"{}", 5)
    assert reply.status == 200 and reply.content == b'{"n": 1}'
    response = client.get(server.url + "/v1/models")  # httpx's way in: the final head's headers
    assert response.json() == {"n": 2} and "link" not in response.headers
    assert server.connections == 1  # kept alive across both


def test_chunked_and_close_delimited_bodies_are_read_whole(serve, client) -> None:
    def answer(conn: socket.socket, n: int) -> bool | None:
        if n == 1:
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
            conn.sendall(b"6\r\n world\r\n0\r\n\r\n")
            return None
        if n == 2:
            conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
            return False  # closes: the body ends with the connection
        conn.sendall(ok(b"third"))
        return None

    server = serve(answer)
    with client.stream("POST", server.url + "/v1/completions", b"{}", 5) as (status, chunks):
        assert status == 200 and b"".join(chunks) == b"hello world"
    assert client.call("POST", server.url + "/v1/completions", b"{}", 5).content == b"until the end"
    assert client.call("POST", server.url + "/v1/completions", b"{}", 5).content == b"third"
    assert server.connections == 2  # the closed one is not reused


def test_a_pooled_connection_the_server_closed_is_replaced(serve, client) -> None:
    def answer(conn: socket.socket, n: int) -> bool:
        conn.sendall(ok(b"%d" % n))
        return False  # the server closes every connection after one answer, without saying so

    server = serve(answer)
    for n in (1, 2, 3):
        assert client.call("POST", server.url + "/x", b"{}", 5).content == b"%d" % n
        time.sleep(0.1)  # as an idle keep-alive timeout does: the close comes before the next call
    assert server.connections == 3


def test_a_request_the_server_took_and_dropped_is_not_sent_again(serve, client) -> None:
    """A restart mid-request: the server read it and closed without answering. Sending it
    again could reach new weights behind the session's back (a paused server is its call)."""

    def answer(conn: socket.socket, n: int) -> bool | None:
        if n == 1:
            conn.sendall(ok(b"first"))
            return None
        return False  # took the second request, closed without an answer

    server = serve(answer)
    assert client.call("POST", server.url + "/x", b"{}", 5).content == b"first"
    with pytest.raises(http_client.TRANSPORT_ERRORS):
        client.call("POST", server.url + "/x", b"{}", 5)  # on the pooled connection
    assert len(server.requests) == 2 and server.connections == 1


def test_a_body_cut_short_and_a_non_http_answer_are_transport_errors(serve, client) -> None:
    def answer(conn: socket.socket, n: int) -> bool:
        if n == 1:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        else:
            conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        return False

    server = serve(answer)
    with pytest.raises(httpcore.RemoteProtocolError, match="before the response ended"):
        client.call("POST", server.url + "/x", b"{}", 5)
    with pytest.raises(http_client.TRANSPORT_ERRORS):
        client.call("POST", server.url + "/x", b"{}", 5)
    with pytest.raises(httpx.RemoteProtocolError):  # httpx's way in gets httpx's error
        client.get(server.url + "/y")


def test_a_silent_server_is_a_read_timeout(serve, client) -> None:
    server = serve(lambda conn, n: None)  # reads the request, never answers
    with pytest.raises(httpcore.ReadTimeout):
        client.call("POST", server.url + "/x", b"{}", 0.3)
    with pytest.raises(httpx.ReadTimeout):
        client.get(server.url + "/x", timeout=0.3)


def test_a_header_or_target_that_would_smuggle_a_request_is_refused_before_sending() -> None:
    for name, value in ((b"X-Key", b"a\r\nX-Admin: 1"), (b"X Key", b"a"), (b"X-Key:", b"a"), (b"X-Key", b"a\0")):
        with pytest.raises(httpcore.LocalProtocolError):
            request_bytes("POST", "/x", [(name, value)], b"{}")
    with pytest.raises(httpcore.LocalProtocolError):
        request_bytes("GET", "/x HTTP/1.1\r\nX-Admin: 1\r\n\r\nGET /y", [], None)


def test_a_credential_header_with_a_line_break_never_reaches_the_server(serve, client) -> None:
    server = serve(lambda conn, n: conn.sendall(ok(b"{}")))
    with pytest.raises(http_client.TRANSPORT_ERRORS):
        client.call("POST", server.url + "/x", b"{}", 5, {"Authorization": "Bearer a\r\nX-Admin: 1"})
    assert server.requests == []


def test_an_abort_cuts_a_call_blocked_on_a_reused_connection(serve, client) -> None:
    """The abort handle finds the lane's pooled connection (RecordingBackend's stream)."""
    from agents.llm.backends.abort import abort_when

    gate = threading.Event()

    def answer(conn: socket.socket, n: int) -> None:
        if n == 1:
            conn.sendall(ok(b"first"))
        else:
            gate.wait(10)  # the second call hangs until the test ends

    connects = []
    original = RecordingBackend.connect_tcp

    def counting(self, *args, **kwargs):
        connects.append(args)
        return original(self, *args, **kwargs)

    server = serve(answer)
    RecordingBackend.connect_tcp = counting
    try:
        assert client.call("POST", server.url + "/x", b"{}", 5).content == b"first"
        flag = threading.Event()
        threading.Timer(0.3, flag.set).start()
        started = time.monotonic()
        with abort_when(flag.is_set), pytest.raises(http_client.TRANSPORT_ERRORS):
            client.call("POST", server.url + "/x", b"{}", 30)
        assert time.monotonic() - started < 10  # cut, not the 30 s read timeout
    finally:
        RecordingBackend.connect_tcp = original
        gate.set()
    assert len(connects) == 1  # the second call was on the pooled connection, and was cut


def test_an_https_server_is_reached_over_tls_with_its_name_checked(serve, tmp_path, monkeypatch) -> None:
    """TLS through the backend's `start_tls`, verified against SSL_CERT_FILE (as httpx does)."""
    import ssl
    import subprocess

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"]
        + ["-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)

    def answer(conn: socket.socket, n: int) -> None:
        conn.sendall(ok(b"secret"))

    server = serve(answer, server_context)
    port = server.url.rsplit(":", 1)[1]
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    client = http_client.make_client(2)
    try:
        assert client.call("POST", f"https://localhost:{port}/v1/completions", b"{}", 5).content == b"secret"
        assert client.get(f"https://localhost:{port}/v1/models").content == b"secret"
        with pytest.raises(http_client.TRANSPORT_ERRORS):  # the certificate names localhost only
            client.call("POST", f"https://127.0.0.1:{port}/v1/completions", b"{}", 5)
    finally:
        client.close()
    assert server.connections == 2  # the two localhost requests shared one TLS connection
