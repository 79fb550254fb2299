"""Issue 22.10: `raas up`'s built-in server against connections that never finish their headers.

Real sockets against the real gateway app on `app.ops.devserver`: half-open connections beyond the
cap are answered 503 at once, the ones within it are closed at the header deadline, and an
honest client is served throughout and afterwards; the access log never shows a `?token=`.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import httpx
import pytest

from app import create_app
from app.ops.devserver import make_server
from core.settings import Settings

HALF_OPEN = 60
CAP = 20


@pytest.fixture
def bounded(tmp_path):
    settings = Settings(
        home=tmp_path,
        handler_modules="tests.pipeline_handlers",
        dev_server={"max_connections": CAP, "header_timeout": 1.5, "idle_timeout": 5},
    )
    from migrations.runner import upgrade

    upgrade(settings.db_url)
    server = make_server("127.0.0.1", 0, create_app(settings), settings)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _half_open(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # headers never finished
    return sock


def _closed_within(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before closing `sock` within `seconds` (None: still open)."""
    sock.settimeout(seconds)
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return data


def test_half_open_connections_are_capped_and_timed_out(bounded):
    port = bounded.server_port
    threads_before = threading.active_count()
    socks = [_half_open(port) for _ in range(HALF_OPEN)]
    time.sleep(0.5)
    held = threading.active_count() - threads_before
    assert held <= CAP + 1, held  # the 300-thread attack holds at most the cap
    started = time.monotonic()
    answers = [_closed_within(s, 10) for s in socks]
    closed_after = time.monotonic() - started
    for s in socks:
        s.close()
    assert all(a is not None for a in answers)  # every one closed by the server
    busy = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
    assert len(busy) == HALF_OPEN - CAP and bounded.refused == len(busy)
    assert bounded.timed_out == CAP and closed_after < 8
    # the honest control: served after the attack, and the threads are back
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
    deadline = time.monotonic() + 10
    while threading.active_count() - threads_before > 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert threading.active_count() - threads_before <= 1


def test_an_honest_client_is_served_while_slots_are_free(bounded):
    port = bounded.server_port
    socks = [_half_open(port) for _ in range(CAP // 2)]
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            for _ in range(5):  # keep-alive requests on one connection
                assert client.get("/healthz").status_code == 200
    finally:
        for s in socks:
            s.close()


def test_access_log_never_shows_a_token(bounded, caplog):
    caplog.set_level(logging.INFO, logger="werkzeug")
    secret = "alice-token-0001"
    httpx.get(f"http://127.0.0.1:{bounded.server_port}/healthz?token={secret}&x=1", timeout=10)
    time.sleep(0.2)
    lines = [r.getMessage() for r in caplog.records if "/healthz" in r.getMessage()]
    assert lines and all(secret not in line for line in lines)
    assert any("token=***" in line for line in lines)
