"""Start a tool session in a pid namespace of its own, below the tool server's.

`python3 -I -S isolate.py -- PROGRAM ARGS...` (standalone: stdlib only, run by path).

Why: the agent holds a shell for the whole RUN, and a policy learns whatever pays. If its
processes share the server's pid namespace and uid, `kill -STOP $PPID` freezes the server and
every later call times out: an infrastructure failure, a dropped sample, a free re-roll. In a
child pid namespace the server has no pid at all: `kill`, `ptrace` and `pidfd_send_signal`
address processes by the caller's namespace, so nothing the agent runs can name the server
(or this helper), and the namespace's init ignores the agent's signals too.

This helper needs CAP_SYS_ADMIN in the sandbox's user namespace (bwrap grants it to the server
with `--cap-add`): it unshares the pid and mount namespaces, forks the session's program as
pid 1 of the new namespace (with a fresh /proc where the kernel allows it), drops every
capability there before exec (ambient, permitted, effective, inheritable; no_new_privs is set
by bwrap), and stays as the session's process for the server: it forwards the server's
signals, exits with the program's status, and takes the namespace with it when it is killed
(the child's parent-death signal is SIGKILL, and the kernel kills a namespace with its init).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
MS_REC, MS_PRIVATE, MS_NOSUID, MS_NODEV, MS_NOEXEC = 16384, 1 << 18, 2, 4, 8
PR_SET_PDEATHSIG, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 1, 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCONT,
)
EXIT_NO_NAMESPACE = 125

libc = ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """Clear the ambient set and set permitted/effective/inheritable to nothing (a process
    may always lower its own capabilities)."""
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), ctypes.byref(data)) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def _fresh_proc() -> bool:
    """Mount a /proc of the new pid namespace (needs the new mount namespace); False when the
    kernel refuses (the agent then sees the outer /proc, but can still name no process there)."""
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return False
    return libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) == 0


def _child(argv: list[str], own_mounts: bool) -> None:
    """Pid 1 of the new namespace: tie its life to the helper, drop privileges, exec."""
    try:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if own_mounts:
            _fresh_proc()
        drop_capabilities()
        os.execvp(argv[0], argv)
    except BaseException as exc:  # noqa: BLE001 - never return into the helper's code
        os.write(2, f"isolate: cannot start {argv[0]}: {exc}\n".encode())
    os._exit(127)


def main(argv: list[str]) -> int:
    """Unshare, fork the program as the namespace's init, forward signals, pass its status on."""
    if "--" in argv:
        argv = argv[argv.index("--") + 1 :]
    if not argv:
        os.write(2, b"usage: isolate.py -- PROGRAM [ARGS...]\n")
        return 2
    try:
        with open("/proc/self/oom_score_adj", "w") as handle:  # tools before the server
            handle.write("500")
    except OSError:
        pass
    own_mounts = libc.unshare(CLONE_NEWPID | CLONE_NEWNS) == 0
    if not own_mounts and libc.unshare(CLONE_NEWPID) != 0:
        err = ctypes.get_errno()
        os.write(2, f"isolate: no pid namespace for the tools: {os.strerror(err)}\n".encode())
        return EXIT_NO_NAMESPACE  # fail closed: never run the agent beside the server
    pid = os.fork()
    if pid == 0:
        _child(argv, own_mounts)
    drop_capabilities()
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, _frame: _forward(pid, signum))
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            return 1
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _forward(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
