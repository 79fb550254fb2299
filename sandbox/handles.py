"""Node-local bookkeeping of live sandboxes: handle files, liveness checks, forced kills.

A handle file is written before anything is started (an intent record, `state: starting`,
naming the process that starts it), again with the launcher's pid as soon as it exists, and
a last time when the sandbox is ready. The launcher waits behind a gate until its pid is on
disk, so a starter killed at any point leaves either nothing running or a record that names
what runs: a reaper stops sandboxes whose starter died before they were ready.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from sandbox.settings import default_state_dir
from sandbox.toolserver.procs import descendants, is_running, start_time

STARTING, READY = "starting", "ready"
# The label of a warm-pool member nobody claimed yet (sandbox.pool): it belongs to the process
# that started it (`owner_pid`) until a claim relabels it for a rollout.
POOL_LABEL = "raas-pool"
# The launcher's first process: waits for one line on stdin (the gate), then becomes the
# real command with stdin from /dev/null. If the starter dies first, stdin reaches EOF and
# it exits without starting anything.
GATE = ["/bin/sh", "-c", 'read -r go && [ "$go" = go ] || exit 97; exec "$@" </dev/null', "raas-gate"]

Handle = dict[str, Any]


def state_root(override: str | os.PathLike | None = None) -> Path:
    """Per-user directory (0700) holding sockets and handle files of this node's sandboxes."""
    root = Path(override or default_state_dir())
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    if root.stat().st_uid != os.getuid():  # another user could hijack our sockets
        raise PermissionError(f"sandbox state dir {root} is not owned by uid {os.getuid()}")
    return root


# A handle's temporary file (`write_handle`) older than this was left by a writer killed
# between its write and its rename: a live writer renames within milliseconds.
STALE_TEMP_SECONDS = 10.0


def write_handle(handle: Handle) -> None:
    """Persist a handle atomically next to its socket directory."""
    path = Path(handle["handle_file"])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(handle, indent=1))
    os.replace(tmp, path)


def remove_stale_temps(root: Path, older_than: float = STALE_TEMP_SECONDS) -> int:
    """Delete the temporary handle files (`<id>.tmp`) of writers killed between the write and
    the rename (a SIGKILLed INIT worker mid-start: its intent record may never have become a
    handle, so no sweep of handles would find it); how many."""
    removed, now = 0, time.time()
    for path in root.glob("*.tmp"):
        try:
            if now - path.stat().st_mtime > older_than:
                path.unlink()
                removed += 1
        except OSError:
            continue
    return removed


def write_intent(handle: Handle) -> None:
    """Record a sandbox about to start, and which process starts it (pid and start time)."""
    me = os.getpid()
    handle.update(state=STARTING, owner_pid=me, owner_start=start_time(me))
    write_handle(handle)


def mark_ready(handle: Handle) -> None:
    """Complete the intent: the sandbox is ready and belongs to the node from now on."""
    handle["state"] = READY
    write_handle(handle)


def unclaimed(handle: Handle) -> bool:
    """True for a warm-pool member no rollout has claimed."""
    return handle.get("label") == POOL_LABEL


def orphaned(handle: Handle) -> bool:
    """True for a start whose starter died before the sandbox was ready, or a pool member
    whose pool process died before anyone claimed it (nobody will finish or claim it, nobody
    else knows it): whatever it launched is garbage."""
    return (handle.get("state") == STARTING or unclaimed(handle)) and not pid_alive(
        handle.get("owner_pid"), handle.get("owner_start")
    )


def gated_popen(argv: list[str], handle: Handle, **kwargs: Any) -> subprocess.Popen:
    """Start `argv` behind the gate, record its pid in the handle file, then open the gate:
    the command never runs unrecorded (its stdin is /dev/null once it runs)."""
    proc = subprocess.Popen([*GATE, *argv], stdin=subprocess.PIPE, **kwargs)
    try:
        handle.update(pid=proc.pid, pid_start=start_time(proc.pid))
        write_handle(handle)
        proc.stdin.write(b"go\n")
    finally:
        proc.stdin.close()  # EOF: the gate exits unless "go" was written
    return proc


def kill_launch(handle: Handle) -> None:
    """Kill the launcher and everything below it (a start cut short: the namespace's init may
    not be recorded yet, but it is still the launcher's descendant)."""
    kill_pid(handle.get("pid"), handle.get("pid_start"), tree=True)
    wait_gone(handle.get("pid"), handle.get("pid_start"))


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


def give_workspace(path: str, uid: int) -> None:
    """Hand a workspace tree to a sandbox's uid (symlinks themselves, never their targets)."""
    os.lchown(path, uid, uid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, uid)


def hand_over(handle: Handle) -> None:
    """Give what the host wrote into a running sandbox's workspace (a handler's INIT) to the
    sandbox's uid, when it runs as one of its own (a root service); else nothing to do."""
    if handle.get("uid") is not None and handle.get("workspace"):
        give_workspace(handle["workspace"], int(handle["uid"]))


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
    if handle.get("endpoint_dir"):  # a model endpoint's folder and a socket left in it
        shutil.rmtree(handle["endpoint_dir"], ignore_errors=True)
    for key in ("log_file", "signal_file", "handle_file"):
        try:
            os.unlink(handle[key])
        except (OSError, KeyError):
            pass
    try:  # a rewrite of the handle cut short by a kill
        os.unlink(Path(handle["handle_file"]).with_suffix(".tmp"))
    except (OSError, KeyError):
        pass
