"""Node-local bookkeeping of live sandboxes: handle files, liveness checks, forced kills."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from sandbox.settings import default_state_dir
from sandbox.toolserver.procs import descendants, is_running

Handle = dict[str, Any]


def state_root(override: str | os.PathLike | None = None) -> Path:
    """Per-user directory (0700) holding sockets and handle files of this node's sandboxes."""
    root = Path(override or default_state_dir())
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    if root.stat().st_uid != os.getuid():  # another user could hijack our sockets
        raise PermissionError(f"sandbox state dir {root} is not owned by uid {os.getuid()}")
    return root


def write_handle(handle: Handle) -> None:
    """Persist a handle atomically next to its socket directory."""
    path = Path(handle["handle_file"])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(handle, indent=1))
    os.replace(tmp, path)


def read_handles(root: Path) -> list[Handle]:
    """Every handle file under `root` (live or not)."""
    handles = []
    for path in sorted(root.glob("*.json")):
        try:
            handles.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return handles


def pid_alive(pid: int | None, started: int | None) -> bool:
    """True when `pid` runs and is the same process (same start time) as recorded."""
    return bool(pid) and started is not None and is_running(pid, started)


def kill_pid(pid: int | None, started: int | None, tree: bool = False) -> None:
    """SIGKILL a recorded process (and optionally its descendants), if it is still that process."""
    if not pid_alive(pid, started):
        return
    victims = (descendants(pid) if tree else []) + [pid]
    for _ in range(3):  # stop first so nothing forks away between scan and kill
        for victim in victims:
            for sig in (signal.SIGSTOP, signal.SIGKILL):
                try:
                    os.kill(victim, sig)
                except OSError:
                    pass
        victims = descendants(pid) if tree and pid_alive(pid, started) else []
        if not victims:
            break


def wait_gone(pid: int | None, started: int | None, timeout: float = 2.0) -> bool:
    """Wait until a recorded process is gone (reaping it if it is our child)."""
    end = time.monotonic() + timeout
    while pid_alive(pid, started):
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


def remove_state(handle: Handle) -> None:
    """Delete the handle file, log and socket directory of a stopped sandbox."""
    for key in ("socket",):
        try:
            os.unlink(handle[key])
        except (OSError, KeyError):
            pass
    for key in ("socket_dir",):
        try:
            os.rmdir(handle[key])
        except (OSError, KeyError):
            pass
    for key in ("log_file", "handle_file"):
        try:
            os.unlink(handle[key])
        except (OSError, KeyError):
            pass
