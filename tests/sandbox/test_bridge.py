"""The model-endpoint bridge, attacked from inside real bwrap sandboxes (issue 23.2).

A harness runs with the network off and must reach its own rollout's endpoint and nothing
else. The host side here is a real HTTP server on each sandbox's endpoint socket (the
rollout endpoint itself is tested in tests/agents/harness); inside, the relay bridges
127.0.0.1:PORT to it, and the tests try every other way out.
"""

from __future__ import annotations

import os
import shlex
import socket
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from sandbox import bridge
from sandbox.bwrap import BwrapRuntime
from bench.support.endpoint_server import UnixHTTPServer, serve_endpoint

pytestmark = pytest.mark.skipif(
    BwrapRuntime.unavailable_reason() is not None, reason="bwrap cannot create namespaces here"
)


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello from {self.server.name} {self.path}".encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def serve() -> Iterator:
    """serve(sandbox, name): a real HTTP server on the sandbox's endpoint socket (0666, as the
    rollout endpoint binds it: the 0700 folder is the guard)."""
    servers: list[UnixHTTPServer] = []

    def _serve(sb, name: str) -> UnixHTTPServer:
        server = serve_endpoint(sb, _Hello)
        server.name = name  # type: ignore[attr-defined]
        servers.append(server)
        return server

    yield _serve
    for server in servers:
        server.shutdown()
        server.server_close()


def fetch(sb, url: str) -> str:
    """GET `url` from inside the sandbox with the system python; the body or the error."""
    code = (
        "import urllib.request,sys\ntry:\n    print(urllib.request.urlopen(sys.argv[1], "
        "timeout=5).read().decode())\nexcept Exception as e:\n    print('ERR', type(e).__name__, e)"
    )
    return sb.bash(f"python3 -c {shlex.quote(code)} {url}").output.strip()


def test_the_harness_reaches_its_own_endpoint_through_loopback(start, serve) -> None:
    sb = start("bwrap", model_endpoint=True)
    serve(sb, "rollout-a")
    port = bridge.start_relay(sb)
    assert fetch(sb, f"http://127.0.0.1:{port}/v1/models") == "hello from rollout-a /v1/models"
    # many calls, one after another and at once (a harness keeps several connections)
    many = sb.bash(
        f"for i in $(seq 20); do python3 -c 'import urllib.request; print(urllib."
        f'request.urlopen("http://127.0.0.1:{port}/n").read().decode())\' & done; '
        "wait"
    ).output
    assert many.count("hello from rollout-a /n") == 20, many


def test_nothing_else_is_reachable_and_the_socket_cannot_be_replaced(start, serve, tmp_path, workspace) -> None:
    ws_b = tmp_path / "ws-b"
    ws_b.mkdir()
    a = start("bwrap", model_endpoint=True)
    b = start("bwrap", model_endpoint=True, workspace=str(ws_b), label="test:1")
    serve(a, "rollout-a")
    serve(b, "rollout-b")
    port_a = bridge.start_relay(a)
    port_b = bridge.start_relay(b)
    assert port_a and fetch(b, f"http://127.0.0.1:{port_b}/") == "hello from rollout-b /"

    # a host TCP server on loopback, and a host abstract Unix socket: neither is reachable
    host_tcp = socket.create_server(("127.0.0.1", 0))
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind(b"\0raas-bridge-test")
    abstract.listen(1)
    try:
        assert fetch(a, f"http://127.0.0.1:{host_tcp.getsockname()[1]}/").startswith("ERR")
        probe = (
            "import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n"
            "    s.connect(b'\\0raas-bridge-test'); print('CONNECTED')\n"
            "except OSError as e:\n    print('ERR', e)"
        )
        assert a.bash(f"python3 -c {shlex.quote(probe)}").output.startswith("ERR")
    finally:
        host_tcp.close()
        abstract.close()
    # another sandbox's relay port is its own namespace's: here nothing listens on it
    if port_b != port_a:
        assert fetch(a, f"http://127.0.0.1:{port_b}/").startswith("ERR")
    # another rollout's socket (by its host path) is not in this sandbox at all
    other = bridge.endpoint_socket(b)
    assert a.bash(f"ls {os.path.dirname(other)} 2>&1; ls -A /run/raas-model").output.strip().endswith("model.sock")
    assert "No such file" in a.bash(f"ls {other} 2>&1").output

    # the socket can be used, never replaced: the folder is a read-only mount
    attack = a.bash(
        "rm -f /run/raas-model/model.sock; mv /run/raas-model/model.sock /tmp/x; "
        "ln -sf /tmp/evil /run/raas-model/model.sock; touch /run/raas-model/new; "
        'python3 -c "import socket; s=socket.socket(socket.AF_UNIX); '
        "s.bind('/run/raas-model/evil.sock')\"; "
        "mount -t tmpfs none /run/raas-model; umount /run/raas-model; "
        "ls -A /run/raas-model"
    ).output
    assert "Read-only file system" in attack and attack.strip().endswith("model.sock"), attack
    assert fetch(a, f"http://127.0.0.1:{port_a}/again") == "hello from rollout-a /again"
    # the tool socket keeps its property: its folder is never mounted
    assert "tool.sock" not in a.bash("find / -xdev -type s 2>/dev/null; echo done").output


@pytest.mark.skipif(os.geteuid() != 0, reason="a root service only: a user's sandbox is that user")
def test_a_root_service_gives_the_socket_folder_to_the_sandbox_user_alone(start, serve) -> None:
    sb = start("bwrap", model_endpoint=True)
    folder = os.stat(sb.handle["endpoint_dir"])
    assert (folder.st_uid, folder.st_mode & 0o777) == (sb.handle["uid"], 0o700)
    serve(sb, "rollout-a")
    port = bridge.start_relay(sb)
    assert fetch(sb, f"http://127.0.0.1:{port}/") == "hello from rollout-a /"


def test_a_detached_program_reports_its_exit_and_can_be_stopped(start) -> None:
    sb = start("bwrap", model_endpoint=True)
    done = bridge.start_detached(
        sb, ["sh", "-c", "echo $GREETING; exit 3"], {"GREETING": "hi there"}, sb.workspace, name="t1"
    )
    for _ in range(50):
        code = bridge.detached_status(sb, done)
        if code is not None:
            break
        sb.bash("sleep 0.1")
    assert code == 3 and bridge.log_tail(sb, done).strip() == "hi there"
    long = bridge.start_detached(sb, ["sleep", "300"], {}, sb.workspace, name="t2")
    assert bridge.detached_status(sb, long) is None
    bridge.stop_detached(sb, long)
    for _ in range(50):
        code = bridge.detached_status(sb, long)
        if code is not None:
            break
        sb.bash("sleep 0.1")
    assert code == -15, code
    missing = bridge.start_detached(sb, ["no-such-harness"], {}, sb.workspace, name="t3")
    for _ in range(50):
        if bridge.detached_status(sb, missing) is not None:
            break
        sb.bash("sleep 0.1")
    assert bridge.detached_status(sb, missing) == 127
    assert "cannot start 'no-such-harness'" in bridge.log_tail(sb, missing)


def test_a_sandbox_without_the_folder_says_so(start) -> None:
    sb = start("bwrap")
    with pytest.raises(bridge.BridgeError, match="model endpoint folder"):
        bridge.start_relay(sb)
