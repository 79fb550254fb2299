"""Process-tree helpers that work without a pid namespace (local runtime) and inside one."""

from __future__ import annotations

import os
import signal
import time


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read().decode("ascii", "replace")
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()  # fields after "pid (comm)", state first


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def session_members(sid: int) -> list[int]:
    """Pids whose session id is `sid` (everything a shell started unless it called setsid)."""
    me = os.getpid()
    members = []
    for pid in _all_pids():
        stat = _stat_fields(pid)
        if stat and pid != me and int(stat[3]) == sid and stat[0] != "Z":
            members.append(pid)
    return members


def kill_session(sid: int, deadline: float = 5.0) -> None:
    """Stop then kill every process of a session, repeating so a fork bomb cannot outrun it."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        members = session_members(sid)
        if not members:
            return
        for sig in (signal.SIGSTOP, signal.SIGKILL):  # stopped processes cannot fork
            for pid in members:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        time.sleep(0.01)


def start_time(pid: int) -> int | None:
    """Kernel start time of `pid` (clock ticks since boot); guards against pid reuse."""
    stat = _stat_fields(pid)
    return int(stat[19]) if stat else None


def is_running(pid: int, started: int) -> bool:
    """True when `pid` is the recorded process (same start time) and not a zombie."""
    stat = _stat_fields(pid)
    return bool(stat) and int(stat[19]) == started and stat[0] not in ("Z", "X")


def set_oom_score(pid: int, score: int) -> None:
    """Make tool processes the OOM killer's first choice so the server survives (best effort)."""
    try:
        with open(f"/proc/{pid}/oom_score_adj", "w") as handle:
            handle.write(str(score))
    except OSError:
        pass


def child_setup(address_space: int = 0):
    """A preexec function: default signals (Python ignores SIGPIPE/SIGXFSZ) and the memory rlimit.

    RLIMIT_AS goes on tool processes only: the threaded server reserves malloc arenas per
    thread and must not run out of address space before the tools it supervises.
    """

    def setup() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, [])  # the server blocks some (signals.py)
        for name in ("SIGPIPE", "SIGXFSZ", "SIGINT"):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
        if address_space:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    return setup


def become_subreaper() -> None:
    """Adopt orphaned descendants so stopping the server can find every process it started."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def reap_orphans(keep: set[int]) -> None:
    """Reap adopted zombies that no session object waits for."""
    me = os.getpid()
    for pid in _all_pids():
        stat = _stat_fields(pid)
        if stat and stat[0] == "Z" and int(stat[1]) == me and pid not in keep:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def descendants(root: int) -> list[int]:
    """All processes below `root` in the process tree."""
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        stat = _stat_fields(pid)
        if stat:
            children.setdefault(int(stat[1]), []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def is_descendant(pid: int, root: int) -> bool:
    """True when `root` is an ancestor of `pid` (what `pid in descendants(root)` says, by
    walking up a few parents instead of reading every process of the host)."""
    seen = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        stat = _stat_fields(pid)
        if not stat:
            return False
        pid = int(stat[1])
        if pid == root:
            return True
    return False


def kill_descendants(root: int, deadline: float = 5.0) -> None:
    """Stop and kill every process below `root` until none is left (orphans were adopted)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        victims = descendants(root)
        if not victims:
            return
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in victims:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        for pid in victims:  # reap what is ours so the next scan does not see zombies
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        time.sleep(0.005)
