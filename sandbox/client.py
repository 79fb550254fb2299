"""Host-side client: one reused Unix-socket connection per sandbox and a deadline per call."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from sandbox.errors import (
    ProtocolError,
    SandboxError,
    SandboxGone,
    SandboxTampered,
    SandboxTimeout,
    ToolUsageError,
)
from sandbox.toolserver import protocol as p
from sandbox.toolserver.procs import start_time
from sandbox.toolserver.protocol import BashResult, Pong, PythonResult

# Time the server may need beyond the tool's own timeout (interrupt, sync, shell restart).
CALL_SLACK = 15.0
_ERRORS: dict[str, type[Exception]] = {
    "ToolUsageError": ToolUsageError,
    "ProtocolError": ProtocolError,
    "SandboxError": SandboxError,
}


def peer_of(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process that listens on the other end (SO_PEERCRED, host pid)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


class ToolClient:
    """Speaks the tool protocol to one server; thread-safe, reconnects after a failure.

    With `server` = (pid, start time[, uid]) every connection checks with SO_PEERCRED that the
    peer is that very process (and runs as that uid, default ours: a root service runs bwrap
    sandboxes as an unprivileged uid): a socket someone swapped raises `SandboxTampered`.
    """

    def __init__(self, socket_path: str, server: tuple[int, ...] | None = None) -> None:
        self.socket_path = socket_path
        self.server = server
        self.sock: socket.socket | None = None
        self.lock = threading.Lock()

    def _connect(self, deadline: float) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            sock.connect(self.socket_path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            raise SandboxGone(f"tool server at {self.socket_path} is gone: {exc}") from exc
        if self.server is not None:
            self._check_peer(sock)
        return sock

    def _check_peer(self, sock: socket.socket) -> None:
        pid, uid = peer_of(sock)
        expected_pid, expected_start, *owner = self.server
        expected_uid = owner[0] if owner else os.getuid()
        if pid != expected_pid or uid != expected_uid or start_time(pid) != expected_start:
            sock.close()
            raise SandboxTampered(
                f"tool socket {self.socket_path} is answered by pid {pid} "
                f"(uid {uid}), not by the server the runtime started "
                f"(pid {expected_pid})"
            )

    def call(self, op: str, args: Any, deadline_s: float) -> dict[str, Any]:
        """Send one request and wait at most `deadline_s` for its answer."""
        with self.lock:
            deadline = time.monotonic() + deadline_s
            try:
                if self.sock is None:
                    self.sock = self._connect(deadline)
                self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
                p.send_frame(self.sock, {"op": op, "args": args})
                reply = p.recv_frame(self.sock)
            except socket.timeout as exc:
                self.close_locked()  # the stream is now out of step with the server
                raise SandboxTimeout(f"tool server gave no answer to {op!r} in {deadline_s:g}s") from exc
            except SandboxTampered:
                raise
            except (ConnectionError, BrokenPipeError, OSError) as exc:
                self.close_locked()
                if isinstance(exc, SandboxGone):
                    raise
                raise SandboxGone(f"lost the tool server during {op!r}: {exc}") from exc
            if reply is None:
                self.close_locked()
                raise SandboxGone(f"tool server closed the connection during {op!r}")
        return _unwrap(reply)

    def close_locked(self) -> None:
        """Drop the connection (caller holds the lock)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def close(self) -> None:
        """Drop the connection."""
        with self.lock:
            self.close_locked()


def _unwrap(reply: dict[str, Any]) -> dict[str, Any]:
    if reply.get("ok"):
        return reply.get("result") or {}
    error = reply.get("error") or {}
    cls = _ERRORS.get(error.get("type", ""), SandboxError)
    raise cls(error.get("message", "unknown tool server error"))


class Sandbox:
    """A running sandbox: tools, liveness and stop, addressed through its JSON handle.

    `stop` is the runtime's `Runtime.stop` (or `sandbox.node.stop_handle`), handed in by whoever
    made this client so the client does not import the runtimes (which import it).
    """

    def __init__(self, handle: dict[str, Any], stop: Callable[[dict[str, Any]], None]) -> None:
        self.handle = handle
        self._stop = stop
        server = (
            (handle["server_pid"], handle["server_start"], handle.get("uid", os.getuid()))
            if handle.get("server_pid")
            else None
        )
        self.client = ToolClient(handle["socket"], server)
        self.call_timeout = float(handle.get("call_timeout", 60.0))

    @property
    def label(self) -> str:
        """The label given at start (e.g. `<rollout_id>:<attempt>`)."""
        return self.handle.get("label", "")

    @property
    def workspace(self) -> str:
        """The workspace path, identical on the host and inside the sandbox."""
        return self.handle["workspace"]

    def _call(self, op: str, args: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        return self.client.call(op, args, (timeout or self.call_timeout) + CALL_SLACK)

    def bash(self, command: str, timeout: float | None = None) -> BashResult:
        """Run a command in the persistent shell; a timeout is `timed_out=True`, not an error."""
        timeout = timeout or self.call_timeout
        return p.decode(BashResult, self._call("bash", {"command": command, "timeout": timeout}, timeout))

    def python(self, code: str, timeout: float | None = None) -> PythonResult:
        """Run code in the persistent Python session."""
        timeout = timeout or self.call_timeout
        return p.decode(PythonResult, self._call("python", {"code": code, "timeout": timeout}, timeout))

    def edit(self, command: str, path: str, **kwargs: Any) -> str:
        """str_replace_editor: view/create/str_replace/insert/undo_edit; misuse raises ToolUsageError."""
        try:
            request = p.EditRequest(command=command, path=path, **kwargs)
        except TypeError:
            known = ", ".join(f.name for f in fields(p.EditRequest))
            raise ToolUsageError(f"Unknown parameter(s) {sorted(kwargs)}; the editor takes: {known}.") from None
        return self._call("edit", p.encode(request))["text"]

    def read_file(self, path: str) -> str:
        """Text of a workspace file."""
        return self._call("read_file", {"path": path})["text"]

    def write_file(self, path: str, content: str) -> None:
        """Create or overwrite a workspace file."""
        self._call("write_file", {"path": path, "content": content})

    def reset(self) -> None:
        """Kill every tool process (shell, Python, their children); the next call starts fresh."""
        self._call("reset", {})

    def attach_layer(self, layer: str, timeout: float = 10.0) -> None:
        """A fork slot's claim: its workspace becomes a copy-on-write fork of `layer` (a folder
        of the layers folder it was started with); raises SandboxError when it cannot."""
        self.client.call("attach", {"layer": layer}, timeout)

    def ping(self, timeout: float = 5.0) -> Pong:
        """Round trip to the tool server; raises SandboxGone/SandboxTimeout if it cannot answer."""
        return p.decode(Pong, self.client.call("ping", {}, timeout))

    def stop(self) -> None:
        """Stop the sandbox and everything it started (idempotent)."""
        self.client.close()
        self._stop(self.handle)

    def close(self) -> None:
        """Close this process's connection; the sandbox keeps running."""
        self.client.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
