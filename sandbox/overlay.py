"""Copy-on-write workspaces: a sandbox whose workspace is a private layer over a shared,
read-only prepared folder (the lower layer), as overlayfs mounted by bwrap inside the
sandbox's own user namespace (no root, nothing mounted on the host).

A fork's folder (`fork_folder`) holds two directories on one mount, as overlayfs wants:
`ws`, the upper layer (what the sandbox wrote, nothing else: its disk quota counts only its
own changes) and the path the agent sees, and `work`, overlayfs' scratch. While the sandbox
runs the host sees only the upper layer. When it stops, `settle` turns `ws` into the merged
view in place, so whoever reads the dead workspace (an artifact) reads what the agent saw:
lower entries the sandbox neither replaced nor deleted are hard-linked in (no data copied;
the host only reads them, and a grading sandbox starts on a fresh folder), whiteouts (the
sandbox's deletions) are removed, and opaque directories (a directory the sandbox deleted and
made again) are not filled from below. Settling is idempotent and crash-safe: the lower is
linked in only while `work` exists, `work` goes next, then the whiteouts; a `settled` mark
ends it.

Where overlays cannot be mounted, `copy_lower` is the fallback: a reflink copy where the
filesystem has them (no data copied), else a full copy (`cp -a --reflink=auto`).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from sandbox.errors import SandboxStartError

if TYPE_CHECKING:
    from sandbox.spec import SandboxSpec

# Entries a settle walks at most (a sample that wrote millions of files is over its quota).
MAX_ENTRIES = 2_000_000
OPAQUE_XATTR = "user.overlay.opaque"  # bwrap mounts with `userxattr` inside a user namespace
UPPER, WORK, SETTLED = "ws", "work", "settled"


def fork_folder(folder: str | os.PathLike) -> tuple[str, str]:
    """Make a fresh fork folder; returns (workspace = upper layer, overlay work dir)."""
    folder = Path(folder)
    if folder.exists():
        remove_tree(folder)
    (folder / UPPER).mkdir(parents=True)
    (folder / WORK).mkdir()
    return str(folder / UPPER), str(folder / WORK)


def give_fork(workspace: str, work: str, uid: int) -> None:
    """Hand the fork's folder, upper and work dirs to the sandbox's uid (they are empty)."""
    for path in (os.path.dirname(workspace), workspace, work):
        os.lchown(path, uid, uid)


def is_whiteout(st: os.stat_result) -> bool:
    """overlayfs marks a deleted lower entry with a 0:0 character device in the upper."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _opaque(path: str) -> bool:
    try:
        return os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) in (b"y", b"x")
    except OSError:
        return False


def settle(handle: dict[str, Any]) -> None:
    """Make a stopped fork's workspace the merged view it had inside (see the module doc)."""
    overlay = handle.get("overlay")
    if not overlay or not os.path.isdir(handle.get("workspace", "")):
        return
    workspace, work = handle["workspace"], overlay["work"]
    mark = os.path.join(os.path.dirname(workspace), SETTLED)
    if os.path.exists(mark):
        return
    if os.path.isdir(work):
        whiteouts = _link_lower(overlay["lower"], workspace)
        remove_tree(work)
    else:  # a settle that stopped between the two steps: find the whiteouts again
        whiteouts = _find_whiteouts(workspace)
    for path in whiteouts:
        os.unlink(path)
    Path(mark).touch()


def _link_lower(lower: str, upper: str) -> list[str]:
    """Hard-link every lower entry the upper lacks into it; returns the upper's whiteouts.
    Nothing is followed: only directories seen by lstat on both sides are descended."""
    whiteouts: list[str] = []
    stack, seen = [""], 0
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(lower, rel)) as it:
            entries = list(it)
        for entry in entries:
            seen += 1
            if seen > MAX_ENTRIES:
                raise OSError(f"the lower layer {lower} holds more than {MAX_ENTRIES} entries")
            child = os.path.join(rel, entry.name)
            target = os.path.join(upper, child)
            lower_is_dir = entry.is_dir(follow_symlinks=False)
            try:
                st = os.lstat(target)
            except FileNotFoundError:
                if lower_is_dir:
                    os.mkdir(target, stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode) | 0o700)
                    stack.append(child)
                else:
                    os.link(entry.path, target, follow_symlinks=False)
                continue
            if is_whiteout(st):
                whiteouts.append(target)
            elif lower_is_dir and stat.S_ISDIR(st.st_mode) and not _opaque(target):
                stack.append(child)
    return whiteouts


def _find_whiteouts(root: str) -> list[str]:
    found, stack = [], [root]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
                elif is_whiteout(st):
                    found.append(entry.path)
    return found


def copy_lower(lower: str, workspace: str) -> None:
    """The fallback fork: the lower's content into the empty `workspace`, as reflinks where
    the filesystem shares extents (btrfs, xfs), else as a plain copy."""
    run = subprocess.run(
        ["cp", "-a", "--reflink=auto", f"{lower}/.", workspace],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
    )
    if run.returncode != 0:
        raise OSError(f"copying the prepared layer {lower} failed: {run.stderr.strip()[-500:]}")


def remove_tree(path: str | os.PathLike) -> None:
    """Delete a folder a sandbox wrote, whatever modes it left (overlayfs leaves a 000 dir in
    its work dir; an agent may chmod its own folders 000); a missing folder is no error."""

    def unlock(func: Any, failed: str, exc_info: Any) -> None:
        try:
            os.chmod(os.path.dirname(failed), 0o700)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, 0o700)
                shutil.rmtree(failed, ignore_errors=True)
            else:
                os.unlink(failed)
        except OSError:
            pass

    if os.path.lexists(path):
        shutil.rmtree(path, onerror=unlock)


def workspace_mount(spec: SandboxSpec, reach: Callable[[str], str]) -> list[str]:
    """The workspace bound read-write, or a fork's overlay: the shared lower read-only, the
    fork folder staged as one source (overlayfs wants upper and work on one mount)."""
    if spec.fork_slot is not None:  # staged for the claim's mount (toolserver/attach.py)
        from sandbox.toolserver.attach import FOLDER, LAYERS

        folder = os.path.dirname(spec.workspace)
        if os.path.dirname(spec.fork_slot.work) != folder:
            raise SandboxStartError(
                "a fork slot's work dir must sit beside its workspace (sandbox.overlay.fork_folder)"
            )
        return [
            "--ro-bind",
            reach(spec.fork_slot.layers),
            LAYERS,
            "--bind",
            reach(folder),
            FOLDER,
            "--dir",
            spec.inner_workspace,
        ]
    if spec.overlay is None:
        return ["--bind", reach(spec.workspace), spec.inner_workspace]
    folder = os.path.dirname(spec.workspace)
    if os.path.dirname(spec.overlay.work) != folder:
        raise SandboxStartError("a fork's work dir must sit beside its workspace (sandbox.overlay.fork_folder)")
    staged = reach(folder)
    return [
        "--overlay-src",
        reach(spec.overlay.lower),
        "--overlay",
        f"{staged}/{os.path.basename(spec.workspace)}",
        f"{staged}/{os.path.basename(spec.overlay.work)}",
        spec.inner_workspace,
    ]
