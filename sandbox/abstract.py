"""The Runtime interface and its config base, and what runtime implementations share to start
a tool server (pin it, wait for it, shut it down). The node-wide operations on sandboxes of any
runtime (pick a runtime, attach, stop, list) are in `sandbox.node`."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from sandbox.client import Sandbox, ToolClient
from sandbox.errors import SandboxStartError
from sandbox.overlay import settle
from sandbox.handles import STARTING, Handle, kill_launch, mark_ready, remove_state, state_root, write_intent
from sandbox.settings import SandboxSettings
from sandbox.spec import SandboxSpec

log = logging.getLogger(__name__)


class RuntimeConfig(BaseModel):
    """The config a job chooses a runtime with. Each runtime module declares a subclass whose
    `type` is a one-value Literal (its registered name); `sandbox.registry.config_union()`
    joins them into one union discriminated on `type`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str


class Runtime(ABC):
    """Starts sandboxes of one kind; stopping and attaching only need the handle."""

    name: ClassVar[str] = ""  # set by `sandbox.registry.register` from the config's `type`
    config: ClassVar[type[RuntimeConfig]] = RuntimeConfig

    def __init__(self, settings: SandboxSettings | None = None, **changes: Any) -> None:
        """`settings` are the node's; keyword `changes` replace single fields (e.g. state_dir)."""
        self.settings = (settings or SandboxSettings()).with_changes(**changes)
        self.state_dir = state_root(self.settings.state_dir)
        self.start_timeout = self.settings.start_timeout

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this runtime cannot run on this node, or None when it can."""
        return None

    @classmethod
    def overlay_unavailable_reason(cls) -> str | None:
        """Why this runtime cannot start copy-on-write workspaces (`SandboxSpec.overlay`)
        here, or None when it can."""
        return f"the {cls.name} runtime does not mount overlays"

    def fork_slots_unavailable_reason(self) -> str | None:
        """Why this runtime cannot start fork slots (`SandboxSpec.fork_slot`: a warm fork whose
        layer is named at its claim) here, or None when it can."""
        return f"the {self.name} runtime has no fork slots"

    @abstractmethod
    def start(self, spec: SandboxSpec, label: str = "") -> Sandbox:
        """Start a sandbox for `spec`; returns it once its tool server answers."""

    @classmethod
    @abstractmethod
    def kill(cls, handle: Handle) -> None:
        """Force everything the sandbox started to be gone (no RPC, works if the server hangs)."""

    @classmethod
    @abstractmethod
    def alive(cls, handle: Handle) -> bool:
        """True while the sandbox's processes exist."""

    def new_handle(self, spec: SandboxSpec, label: str) -> Handle:
        """A fresh handle with the paths this sandbox will use on the node, recorded on disk
        (an intent: `state` starting) before any of them exists."""
        if not os.path.isdir(spec.workspace):
            raise SandboxStartError(f"workspace {spec.workspace} is not a directory")
        if spec.overlay is not None:
            reason = self.overlay_unavailable_reason()
            if reason is not None:
                raise SandboxStartError(f"copy-on-write workspace refused: {reason}")
        sid = uuid.uuid4().hex[:12]
        socket_dir = self.state_dir / sid
        handle = {
            "runtime": self.name,
            "id": sid,
            "label": label,
            "node": self.settings.node,
            "workspace": spec.workspace,
            "created": time.time(),
            "socket_dir": str(socket_dir),
            "socket": str(socket_dir / "tool.sock"),
            "handle_file": str(self.state_dir / f"{sid}.json"),
            "log_file": str(self.state_dir / f"{sid}.log"),
            "call_timeout": spec.limits.call_timeout,
        }
        if spec.overlay is not None:
            handle["overlay"] = spec.overlay.model_dump()
        if spec.fork_slot is not None:  # becomes "overlay" at the claim (sandbox.pool)
            handle["fork_slot"] = spec.fork_slot.model_dump()
        if spec.workspace_inside is not None:  # what the agent is shown (RUN's ctx.workspace)
            handle["workspace_inside"] = spec.workspace_inside
        if spec.model_endpoint:
            handle["endpoint_dir"] = str(self.state_dir / f"{sid}.model")
        write_intent(handle)
        socket_dir.mkdir(mode=0o700)
        if spec.model_endpoint:
            os.mkdir(handle["endpoint_dir"], 0o700)
        return handle

    def save(self, handle: Handle) -> Sandbox:
        """Complete the handle file (the sandbox is ready) and return a client for it."""
        mark_ready(handle)
        return Sandbox(handle, self.stop)

    @classmethod
    def stop(cls, handle: Handle) -> None:
        """Stop one of this runtime's sandboxes from any process; idempotent, never raises for
        an already-gone sandbox. A sandbox still starting (an intent record) is stopped through
        its launcher's process tree as well: its namespace's init may not be recorded yet."""
        if handle.get("state") == STARTING:
            kill_launch(handle)
        cls.kill(handle)
        remove_state(handle)
        settle(handle)  # a fork's workspace becomes the merged view its agent saw


def pin_server(handle: Handle, timeout: float = 5.0) -> None:
    """Record which process serves the tool socket (SO_PEERCRED at first contact, before any
    agent code ran); every later connection must reach that very process (`ToolClient`)."""
    from sandbox.client import peer_of
    from sandbox.toolserver.procs import is_descendant, start_time

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(handle["socket"])
        pid, uid = peer_of(sock)
    except OSError as exc:
        raise SandboxStartError(f"tool socket {handle['socket']} did not answer: {exc}") from exc
    finally:
        sock.close()
    root = handle.get("pid")
    if uid != handle.get("uid", os.getuid()) or (pid != root and not is_descendant(pid, root)):
        raise SandboxStartError(
            f"tool socket answered by pid {pid} (uid {uid}), which this runtime did not start (pid {root})"
        )
    handle.update(server_pid=pid, server_start=start_time(pid))


def shutdown_quietly(handle: Handle, timeout: float = 1.0) -> None:
    """Ask a tool server to stop its sessions; ignore any failure (the kill follows)."""
    try:
        server = (
            (handle["server_pid"], handle["server_start"], handle.get("uid", os.getuid()))
            if handle.get("server_pid")
            else None
        )
        ToolClient(handle["socket"], server).call("shutdown", {}, timeout)
    except Exception:  # noqa: BLE001 - best effort before a forced kill
        pass


def server_ready(proc_poll, ready_fd: int, timeout: float, log_file: str) -> None:
    """Wait for the tool server's readiness byte; raise SandboxStartError with the log tail."""
    import select

    end = time.monotonic() + timeout
    while True:
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise SandboxStartError(f"tool server not ready after {timeout:g}s: {_tail(log_file)}")
        if select.select([ready_fd], [], [], min(remaining, 0.5))[0]:
            if os.read(ready_fd, 64):
                return
            raise SandboxStartError(f"sandbox exited during start: {_tail(log_file)}")
        if proc_poll() is not None:
            raise SandboxStartError(f"sandbox exited during start: {_tail(log_file)}")


def _tail(path: str, size: int = 2000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-size:]
    except OSError:
        return "(no log)"
