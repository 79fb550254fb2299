"""Whether bwrap can mount a fork's overlay on this node: one tiny overlay, mounted as the
sandboxes will be (as the unprivileged sandbox uid through launch_as.py when run as root),
tried once per process (`BwrapRuntime.overlay_unavailable_reason`, `raas doctor`)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path


def overlay_probe(binary: str, uid: int | None, launch_as: list[str], env: dict[str, str]) -> str | None:
    """Mount a tiny overlay with `binary`, as sandboxes will (as `uid` behind the `launch_as`
    command head when root): None when it works; else why (an old kernel, overlayfs not
    allowed in user namespaces)."""
    with tempfile.TemporaryDirectory(prefix="raas-overlay-probe-") as scratch:
        for name in ("lower", "fork/ws", "fork/work", "dest"):
            os.makedirs(os.path.join(scratch, name))
        Path(scratch, "lower", "probe").write_text("x")
        if uid is not None:
            for root, dirs, files in os.walk(scratch):
                for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                    os.lchown(name, uid, uid)
            os.chmod(scratch, 0o755)
        argv = ["--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
        argv += ["--overlay-src", f"{scratch}/lower", "--overlay", f"{scratch}/fork/ws", f"{scratch}/fork/work"]
        argv += [f"{scratch}/dest", "/bin/sh", "-c", f"echo y > {scratch}/dest/probe"]
        fds: tuple[int, ...] = ()
        if uid is not None:
            fd = os.open(binary, os.O_RDONLY)
            fds, argv = (fd,), [*launch_as, str(fd), "/", "--", "bwrap", *argv]
        else:
            argv = [binary, *argv]
        try:
            run = subprocess.run(argv, capture_output=True, timeout=10, pass_fds=fds, env=dict(env))
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"the overlay probe failed to run: {exc}"
        finally:
            for fd in fds:
                os.close(fd)
        if run.returncode != 0:
            return f"bwrap cannot mount an overlay here: {run.stderr.decode(errors='replace')[-300:]}"
        if Path(scratch, "lower", "probe").read_text() != "x" or not Path(scratch, "fork/ws/probe").is_file():
            return "the overlay probe's write did not land in its upper layer"
    return None
