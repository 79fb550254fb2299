"""A fork slot: a started sandbox whose workspace becomes a copy-on-write layer over a group's
prepared folder only when it is claimed (stdlib only: part of the standalone tool server).

Why: a GRPO group's samples fork one prepared layer (sandbox/overlay.py). bwrap mounts an
overlay only when it starts, so a fork started after its layer is ready costs a cold start per
sample, hundreds of milliseconds on a loaded node, after the group's INIT. A fork slot starts
ahead of any layer, like any warm sandbox, with two folders staged inside by bwrap: the node's
layers folder (read-only) at `LAYERS` and the slot's own fork folder (upper layer + overlayfs'
work dir) at `FOLDER`. The claim names the layer; mounting it takes milliseconds.

Who holds what: overlayfs records its mounter's credentials and does its copy-ups with them,
so the mount needs the filesystem capabilities of the sandbox's user namespace (the ones
bwrap itself mounts with), and a mount there needs a mount namespace that namespace owns.
`prepare` therefore runs first in the server, still single-threaded (capabilities are per
thread, and unsharing a mount namespace needs one thread): it unshares the mount namespace,
forks a one-shot *mounter* that keeps the capabilities, then lowers the server's own to the
CAP_SYS_ADMIN the pid-namespace helper needs (isolate.py), in every set, bounding included.
The mounter (not dumpable, killed with the server) waits on a pipe for one layer name, mounts
the overlay on the workspace, covers both staged folders with empty read-only tmpfs (mounts
copied into a less privileged namespace cannot be unmounted, only covered) and exits: nothing
inside can then reach another group's layer or the fork folder's work dir. The server refuses
every tool call until the mount is done, so no tool session ever sees the empty mount point,
and tool sessions drop every capability (isolate.py) as before.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal

LAYERS, FOLDER = "/run/raas-layers", "/run/raas-fork"  # where bwrap stages them inside
UPPER, WORK = "ws", "work"  # the fork folder's layout (sandbox/overlay.py)
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, PR_CAP_AMBIENT_CLEAR_ALL = 47, 2, 4
CAP_SYS_ADMIN, CAP_LAST = 21, 63
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
LAYER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

libc = ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def keep_only_sys_admin() -> None:
    """This thread's capabilities lowered to CAP_SYS_ADMIN in every set (bounding, permitted,
    effective, inheritable, ambient), as bwrap's `--cap-add CAP_SYS_ADMIN` alone leaves them."""
    for cap in range(CAP_LAST + 1):
        if cap != CAP_SYS_ADMIN:
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the kernel's last cap
    _check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    bit = 1 << CAP_SYS_ADMIN
    data[0].effective = data[0].permitted = data[0].inheritable = bit
    _check(libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")
    _check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_SYS_ADMIN, 0, 0), "raise ambient CAP_SYS_ADMIN")


def overlay_options(layer: str) -> bytes:
    """The overlay's mount options for the named layer (a plain folder name: checked)."""
    if not LAYER_NAME.match(layer):
        raise ValueError(f"not a layer name: {layer!r}")
    return (f"userxattr,lowerdir={LAYERS}/{layer},upperdir={FOLDER}/{UPPER},workdir={FOLDER}/{WORK}").encode()


def _mount(layer: str, workspace: str) -> None:
    """In the mounter: the overlay on the workspace, then the staged folders covered."""
    if not os.path.isdir(os.path.join(LAYERS, layer)):
        raise FileNotFoundError(f"no layer {layer!r} in the node's layers folder")
    _check(
        libc.mount(b"overlay", workspace.encode(), b"overlay", MS_NOSUID | MS_NODEV, overlay_options(layer)),
        f"mount the overlay of layer {layer!r}",
    )
    for staged in (LAYERS, FOLDER):
        _check(
            libc.mount(
                b"none", staged.encode(), b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, b"size=4k,mode=0"
            ),
            f"cover {staged}",
        )


def _mounter(requests: int, replies: int, workspace: str) -> None:
    """The forked child: wait for one layer name, mount, answer "ok" or the error, exit."""
    code = 1
    try:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        for fd in range(3, 1024):  # the server's (its listening socket, ready pipe): not ours
            if fd not in (requests, replies):
                try:
                    os.close(fd)
                except OSError:
                    pass
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        with os.fdopen(requests, "rb") as pipe:
            layer = pipe.readline().decode().strip()
        if layer:
            try:
                _mount(layer, workspace)
                answer, code = "ok", 0
            except (OSError, ValueError) as exc:
                answer = f"{type(exc).__name__}: {exc}"
            os.write(replies, answer.encode()[:4000] + b"\n")
    finally:
        os._exit(code)


class ForkSlot:
    """The server's side of a fork slot: `attach` once, then the workspace is the layer's fork."""

    def __init__(self, workspace: str) -> None:
        self.workspace = workspace
        self.attached: str | None = None
        self._pid = -1
        self._requests = self._replies = -1

    def prepare(self) -> None:
        """Unshare, fork the mounter, lower this process's capabilities. Call before any thread."""
        _check(libc.unshare(CLONE_NEWNS), "unshare the mount namespace")
        to_child, self._requests = os.pipe()
        self._replies, from_child = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(self._requests)
            os.close(self._replies)
            _mounter(to_child, from_child, self.workspace)
        os.close(to_child)
        os.close(from_child)
        self._pid = pid
        keep_only_sys_admin()

    def attach(self, layer: str) -> None:
        """Mount `layer`'s fork on the workspace (once); raises ValueError or OSError."""
        if self.attached is not None:
            raise ValueError(f"this sandbox's workspace is already a fork of {self.attached!r}")
        overlay_options(layer)  # refuse a bad name before the one-shot mounter sees it
        os.write(self._requests, layer.encode() + b"\n")
        os.close(self._requests)
        with os.fdopen(self._replies, "rb") as pipe:
            answer = pipe.readline().decode().strip()
        try:
            os.waitpid(self._pid, 0)
        except ChildProcessError:  # the server's orphan reaper took the zombie first
            pass
        if answer != "ok":
            raise OSError(answer or "the mounter died without an answer")
        self.attached = layer
