"""This node's sandboxes, whatever their runtime: pick a runtime by name, attach to a sandbox
another process started, stop one from its handle, list the live ones (for reapers). The
runtime interface itself is `sandbox.abstract`."""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from sandbox.abstract import Runtime
from sandbox.client import Sandbox
from sandbox.errors import SandboxError, SandboxGone, SandboxStartError, UnknownRuntime
from sandbox.handles import STARTING, Handle, orphaned, read_handles, state_root
from sandbox.registry import check_runtime_name, registered
from sandbox.settings import SandboxSettings

log = logging.getLogger(__name__)


def get_runtime(name: str | None = "auto", settings: SandboxSettings | None = None, **kwargs: Any) -> Runtime:
    """A runtime by name; "auto" is bwrap when usable, else local (with a warning) only when
    the settings allow it: falling back to no isolation is the operator's decision."""
    kwargs["settings"] = settings
    name = name or "auto"
    if name == "auto":
        reason = registered("bwrap").unavailable_reason()
        if reason is None:
            return registered("bwrap")(**kwargs)
        if not (settings or SandboxSettings()).allow_local_fallback:
            raise SandboxStartError(
                f"bwrap is unusable ({reason}) and falling back to the unisolated local runtime is not allowed here"
            )
        log.warning("bwrap is unusable (%s): falling back to the local runtime WITHOUT isolation", reason)
        name = "local"
    if name == "none":
        raise UnknownRuntime("runtime 'none' means the job needs no sandbox; do not start one")
    check_runtime_name(name)
    return registered(name)(**kwargs)


def attach(handle: Handle, node: str | None = None) -> Sandbox:
    """Use a sandbox started by another process on this node (named `node`, default the
    hostname); raises SandboxGone if it is gone."""
    sandbox = Sandbox(handle, stop_handle)
    try:
        sandbox.ping()
    except SandboxGone as exc:
        owner = handle.get("node")
        if owner and owner not in (node, socket.gethostname()):
            raise SandboxGone(f"sandbox {handle.get('id')} lives on node {owner}, not here: {exc}") from exc
        raise
    return sandbox


def stop_handle(handle: Handle) -> None:
    """Stop a sandbox from any process; idempotent, never raises for an already-gone sandbox.

    A sandbox still starting (an intent record) is stopped through its launcher's process
    tree as well: its namespace's init may not be recorded yet."""
    cls = registered(handle.get("runtime", ""))
    if cls is None:
        raise SandboxError(f"handle names unknown runtime {handle.get('runtime')!r}")
    cls.stop(handle)


def is_alive(handle: Handle) -> bool:
    """True while the sandbox runs, or is being started by a live process (an orphaned
    start or pool member counts as dead: nobody will use it)."""
    if orphaned(handle):
        return False
    if handle.get("state") == STARTING:
        return True
    cls = registered(handle.get("runtime", ""))
    return cls is not None and cls.alive(handle)


def list_sandboxes(state_dir: str | os.PathLike | None = None, include_dead: bool = False) -> list[Handle]:
    """Handles of this node's live sandboxes, for reapers; dead ones and starts whose starter
    died (`orphaned`) are cleaned up on the way (processes killed, cgroups and files removed)
    unless `include_dead` asks to see them (then the caller decides, see `orphaned`)."""
    found = []
    for handle in read_handles(state_root(state_dir)):
        cls = registered(handle.get("runtime", ""))
        if include_dead or (cls is not None and is_alive(handle)):
            found.append(handle)
        elif cls is not None:
            stop_handle(handle)
    return found
