"""The tool server: serves bash, python and file tools over a Unix socket, one thread per client."""

from __future__ import annotations

import argparse
import logging
import os
import resource
import signal
import socket
import socketserver
import threading
import time
from typing import Any

from . import protocol as p
from .attach import ForkSlot
from .bash import BashSession
from .editor import Editor
from .procs import become_subreaper, kill_descendants, reap_orphans
from .python import PythonSession
from .signals import block as block_signals
from .signals import start_recorder

log = logging.getLogger("raas.toolserver")
_CONTROL_ENV = ("PYTHONPATH", "RAAS_TOOLSERVER")


class ToolServer:
    """Owns the sessions and dispatches typed requests to them."""

    def __init__(self, args: argparse.Namespace, fork_slot: ForkSlot | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if k not in _CONTROL_ENV}
        self.started = time.monotonic()
        wrap = isolating_prefix() if args.isolate else []
        self.bash = BashSession(env, args.workdir, args.output_bytes, args.address_space, wrap)
        self.python = PythonSession(args.python, env, args.workdir, args.output_bytes, args.address_space, wrap)
        self.editor = Editor(args.workspace)
        self.stopping = threading.Event()
        self.fork_slot = fork_slot
        self.workdir = args.workdir
        self._attach_lock = threading.Lock()

    def handle(self, op: str, args: Any) -> Any:
        """Run one request; raises WireError subclasses for typed failures."""
        if op not in p.OPS:
            raise p.BadRequest(f"unknown op {op!r}")
        request = p.decode(p.OPS[op][0], args)
        if op == "attach":
            return self.attach(request.layer)
        if self.fork_slot is not None and self.fork_slot.attached is None and op not in ("ping", "shutdown"):
            raise p.BadRequest(f"{op!r} before the fork slot's layer is attached: the workspace is not there yet")
        if op == "bash":
            return self.bash.run(request.command, request.timeout)
        if op == "python":
            return self.python.run(request.code, request.timeout)
        if op == "edit":
            return p.TextResult(self.editor.run(request))
        if op == "read_file":
            return p.TextResult(self.editor.read_file(request.path))
        if op == "write_file":
            self.editor.write_file(request.path, request.content)
            return p.Empty()
        if op == "reset":
            self.close_sessions()
            return p.Empty()
        if op == "shutdown":
            self.close_sessions()  # before answering, so the caller may kill us right after
            self.stopping.set()
            return p.Empty()
        return p.Pong(p.PROTOCOL_VERSION, os.getpid(), time.monotonic() - self.started)

    def attach(self, layer: str) -> p.Empty:
        """A fork slot's one attach (its claim): the workspace becomes the layer's fork."""
        if self.fork_slot is None:
            raise p.BadRequest("this sandbox is not a fork slot")
        with self._attach_lock:
            try:
                self.fork_slot.attach(layer)
            except (OSError, ValueError) as exc:
                raise p.BadRequest(f"attach {layer!r}: {exc}") from None
            try:  # made at start on what the mount now covers (a workdir inside the workspace)
                os.makedirs(self.workdir, exist_ok=True)
            except OSError:
                pass  # the shell says so when it cannot start there
        return p.Empty()

    def close_sessions(self) -> None:
        """Kill the shell, the Python worker and everything they started (even setsid'd)."""
        with self.bash.lock, self.python.lock:
            self.bash.kill()
            self.python.kill()
            kill_descendants(os.getpid())


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        tools: ToolServer = self.server.tools  # type: ignore[attr-defined]
        while True:
            try:
                message = p.recv_frame(self.request)
            except (OSError, p.WireError, ValueError):
                return
            if message is None:
                return
            p.send_frame(self.request, _respond(tools, message))
            if tools.stopping.is_set():
                threading.Thread(target=self.server.shutdown, daemon=True).start()
                return


def _respond(tools: ToolServer, message: dict) -> dict:
    try:
        result = tools.handle(message.get("op"), message.get("args", {}))
        return {"ok": True, "result": p.encode(result)}
    except p.WireError as exc:
        return {"ok": False, "error": {"type": exc.type, "message": str(exc)}}
    except Exception as exc:  # any server bug crosses the wire as SandboxError
        log.exception("request %s failed", message.get("op"))
        return {"ok": False, "error": {"type": "SandboxError", "message": f"{type(exc).__name__}: {exc}"}}


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True


def _apply_limits(args: argparse.Namespace) -> None:
    """Lower rlimits for the server and everything it starts (never raised here)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for name, value in (("RLIMIT_NPROC", args.nproc), ("RLIMIT_FSIZE", args.fsize)):
        if value:
            resource.setrlimit(getattr(resource, name), (value, value))


def _reaper(tools: ToolServer) -> None:
    while not tools.stopping.wait(1.0):
        keep = {s.proc.pid for s in (tools.bash, tools.python) if s.proc is not None}
        reap_orphans(keep)


def _listen(args: argparse.Namespace) -> _Server:
    """The listening server: on the inherited socket (bwrap) or on a path created here."""
    if args.listen_fd >= 0:
        server = _Server(args.socket or "inherited", _Handler, bind_and_activate=False)
        server.socket.close()
        server.socket = socket.socket(fileno=args.listen_fd)
        os.set_inheritable(args.listen_fd, False)  # never into a tool process
        server.socket.listen(64)  # listen here, so SO_PEERCRED names this process
        return server
    if os.path.exists(args.socket):
        os.unlink(args.socket)
    server = _Server(args.socket, _Handler)
    os.chmod(args.socket, 0o600)
    return server


def isolating_prefix() -> list[str]:
    """The argv prefix that starts a session in its own pid namespace (`isolate.py`)."""
    import sys

    return [sys.executable, "-I", "-S", os.path.join(os.path.dirname(__file__), "isolate.py"), "--"]


def _not_dumpable() -> None:
    """PR_SET_DUMPABLE 0: tool processes (same uid, no capabilities) can neither ptrace this
    server nor open its /proc/<pid>/fd, so its sockets stay out of their reach."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    except (OSError, AttributeError):
        pass


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line of the server (built by the host-side runtimes)."""
    parser = argparse.ArgumentParser(prog="toolserver")
    parser.add_argument("--socket", default=None, help="path to listen on (created here)")
    parser.add_argument(
        "--listen-fd", type=int, default=-1, help="an inherited bound socket to listen on (its path is not visible)"
    )
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--output-bytes", type=int, default=65536)
    parser.add_argument("--nproc", type=int, default=0)
    parser.add_argument("--address-space", type=int, default=0)
    parser.add_argument("--fsize", type=int, default=0)
    parser.add_argument("--ready-fd", type=int, default=-1)
    parser.add_argument(
        "--signal-fd", type=int, default=-1, help="append a JSON line per terminating signal received (signals.py)"
    )
    parser.add_argument(
        "--isolate", action="store_true", help="run tool sessions in a pid namespace below the server's"
    )
    parser.add_argument(
        "--fork-slot",
        action="store_true",
        help="the workspace is mounted by a later `attach` (toolserver/attach.py); needs --isolate",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Listen, signal readiness on --ready-fd, serve until shutdown, then kill the sessions."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s toolserver %(message)s")
    args = parse_args(argv)
    fork_slot = None
    if args.fork_slot:  # first: single-threaded, and before the capabilities are lowered
        fork_slot = ForkSlot(args.workspace)
        fork_slot.prepare()
    block_signals()  # before any thread: the recorder thread alone takes them
    start_recorder(args.signal_fd)
    _apply_limits(args)
    # a launcher may have ignored SIGINT; ignored signals survive exec, so restore it for tools
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.makedirs(args.workdir, exist_ok=True)
    server = _listen(args)
    become_subreaper()
    _not_dumpable()
    server.tools = ToolServer(args, fork_slot)  # type: ignore[attr-defined]
    threading.Thread(target=_reaper, args=(server.tools,), daemon=True).start()
    if args.ready_fd >= 0:
        os.write(args.ready_fd, b"ready\n")
        os.close(args.ready_fd)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.tools.close_sessions()  # type: ignore[attr-defined]
        server.server_close()
        if args.socket:
            try:
                os.unlink(args.socket)
            except OSError:
                pass
