"""Start bwrap as an unprivileged uid from a root service (standalone: stdlib only, run by path).

`python3 -I -S launch_as.py UID GID EXE_FD STAGE_ROOT [SOURCE...] -- ARGV...`

Why: bwrap run by root maps the sandbox to host root, and host root owns every root-only
file a bind exposes (`/etc` holds several that no deny-list names). So a root service starts
its sandboxes as an unprivileged uid, which reads only what that uid may. But bwrap, now
unprivileged, can bind only paths that uid can reach, and a service's workspaces, environments
and code often lie below 0700 folders (a home, pytest's tmp). Root therefore stages them first:
in a private mount namespace of the launcher alone, it mounts a small tmpfs (0711) on
STAGE_ROOT and bind-mounts each SOURCE at
STAGE_ROOT/<index>; `{stage:<index>}` in ARGV becomes that path. Then it drops every group,
the gid and the uid, and executes bwrap from EXE_FD (opened by root: its path may be below a
0700 home too). Nothing of this is visible on the host; the mounts die with the sandbox.
"""

from __future__ import annotations

import ctypes
import os
import stat
import sys

CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def stage(root: str, sources: list[str]) -> None:
    """Bind each source at root/<index> inside a private mount namespace of this process."""
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    _check(
        libc.mount(b"tmpfs", root.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0711,size=1m"), f"tmpfs on {root}"
    )
    for index, source in enumerate(sources):
        target = os.path.join(root, str(index))
        if stat.S_ISDIR(os.stat(source).st_mode):
            os.mkdir(target, 0o755)
        else:
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
        _check(libc.mount(source.encode(), target.encode(), None, MS_BIND | MS_REC, None), f"bind {source}")


def main(argv: list[str]) -> int:
    """Stage, drop to UID/GID, exec bwrap."""
    split = argv.index("--")
    uid, gid, exe = (int(x) for x in argv[:3])
    root, sources, command = argv[3], argv[4:split], argv[split + 1 :]
    if sources:
        stage(root, sources)
    command = [
        arg.replace("{stage:", root + "/").replace("}", "") if arg.startswith("{stage:") else arg for arg in command
    ]
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    os.execve(exe, command, os.environ)
    return 127


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except OSError as exc:
        os.write(2, f"launch_as: {exc}\n".encode())
        sys.exit(126)
