"""Restore a workspace checkpoint (`sandbox.checkpoint`) into a fresh copy of the workspace.

The checkpoint's content is the agent's: names, symlink targets and file bytes are whatever
it made them, and the file itself could have been tampered with on shared storage. So nothing
is written before every member is checked (`_check`): a relative path without `.`/`..`/empty
components, of a regular file, directory or symlink only (no hard links, devices or fifos),
and `tarfile.data_filter` on files and folders (no escape through a link already in the
workspace; setuid/setgid and group/other write bits cleared). Writing then goes through
directory descriptors opened with `O_NOFOLLOW` on every component, so a symlink, whether in
the checkpoint or already in the workspace, is never followed: a path whose parent is a
symlink is refused, a symlink is created as a symlink (its target is not looked at: inside the
sandbox it resolves in the sandbox's own file system, and the host never reads through it
here). Folders first, then files, then symlinks; deleted paths are removed first.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from sandbox.checkpoint import DIR_FLAGS, META, VERSION, CheckpointError, open_parent

KIND_OF = {tarfile.REGTYPE: "f", tarfile.AREGTYPE: "f", tarfile.DIRTYPE: "d", tarfile.SYMTYPE: "l"}
CHUNK = 1 << 20


class RestoreIncomplete(CheckpointError):
    """A restore that failed after it began writing: the workspace is neither the fresh one
    nor the checkpoint's (the rollout must start over, not replay into it)."""


@dataclass(frozen=True)
class Restored:
    """A restored checkpoint: the turn it was taken after, what it held, how long it took."""

    turn: int
    entries: int
    deleted: int
    seconds: float


def read_meta(path: str | Path) -> dict:
    """The checkpoint's meta member (turn, deleted paths), checked; raises CheckpointError."""
    with tarfile.open(path, mode="r:") as tar:
        return _meta(tar)


def restore(workspace: str | Path, path: str | Path, uid: int | None = None) -> Restored:
    """Apply the checkpoint at `path` to `workspace` (a fresh copy of the one its manifest was
    taken of); what it creates is given to `uid` when set (a root service's sandbox uid)."""
    started = time.monotonic()
    with tarfile.open(path, mode="r:") as tar:
        meta = _meta(tar)
        members = [m for m in tar.getmembers() if m.name != META]
        for name in meta["deleted"]:
            _check_path(name)
        for member in members:
            _check(member, str(workspace))
        _check_parents(Path(workspace), members)
        root = os.open(workspace, DIR_FLAGS)
        try:
            for name in meta["deleted"]:
                _delete(root, name)
            order = {"d": 0, "f": 1, "l": 2}
            members.sort(key=lambda m: (order[KIND_OF[m.type]], m.name))
            for member in members:
                _put(tar, root, member, uid)
            for member in reversed([m for m in members if m.isdir()]):  # files changed their mtimes
                _times(root, member)
        except (OSError, CheckpointError) as exc:
            raise RestoreIncomplete(f"the workspace is half restored: {exc}") from exc
        finally:
            os.close(root)
    return Restored(int(meta["turn"]), len(members), len(meta["deleted"]), time.monotonic() - started)


def _meta(tar: tarfile.TarFile) -> dict:
    first = tar.next()
    if first is None or first.name != META or not first.isfile():
        raise CheckpointError("not a workspace checkpoint: its first member is not the meta record")
    try:
        meta = json.loads(tar.extractfile(first).read())  # type: ignore[union-attr]
    except ValueError as exc:
        raise CheckpointError(f"unreadable checkpoint meta: {exc}") from exc
    if meta.get("version") != VERSION or not isinstance(meta.get("deleted"), list):
        raise CheckpointError(f"checkpoint format {meta.get('version')!r} is not {VERSION}")
    return meta


def _check_path(name: str) -> None:
    """Refuse an absolute path, or one with an empty, `.` or `..` component."""
    if not isinstance(name, str) or not name or name.startswith("/") or "\0" in name:
        raise CheckpointError(f"refused checkpoint path {name!r}: not relative")
    if any(part in ("", ".", "..") for part in name.split("/")):
        raise CheckpointError(f"refused checkpoint path {name!r}: it has an empty, '.' or '..' component")


def _check(member: tarfile.TarInfo, workspace: str) -> None:
    _check_path(member.name)
    if member.type not in KIND_OF:
        raise CheckpointError(
            f"refused checkpoint member {member.name!r}: type {member.type!r} is not a file, dir or symlink"
        )
    if member.issym() or os.path.islink(os.path.join(workspace, member.name)):
        return  # made as a symlink / replaces one, never followed (see the module's docstring)
    try:
        tarfile.data_filter(member, workspace)
    except tarfile.FilterError as exc:
        raise CheckpointError(f"refused checkpoint member {member.name!r}: {exc}") from exc


def _check_parents(workspace: Path, members: list[tarfile.TarInfo]) -> None:
    """Refuse an entry under another entry that is not a folder, or under a path of the
    workspace that is not a folder (a symlink) and that no folder entry replaces: the writes
    would refuse it half-way (a save never makes such a checkpoint)."""
    dirs = {m.name for m in members if m.isdir()}
    others = {m.name for m in members if not m.isdir()}
    for member in members:
        parts = member.name.split("/")
        for k in range(1, len(parts)):
            parent = "/".join(parts[:k])
            if parent in others:
                raise CheckpointError(f"refused checkpoint member {member.name!r}: {parent!r} is not a folder in it")
            if parent not in dirs and (workspace / parent).is_symlink():
                raise CheckpointError(f"refused checkpoint member {member.name!r}: {parent!r} is a symlink here")


def _delete(root: int, name: str) -> None:
    """Remove `name` (a folder with all it holds) without following a symlink; gone already,
    or under a parent that is not a folder of the workspace: nothing to do."""
    try:
        parent, last = open_parent(root, name)
    except (FileNotFoundError, NotADirectoryError, OSError):
        return
    try:
        _remove(parent, last)
    finally:
        if parent != root:
            os.close(parent)


def _remove(parent: int, name: str) -> None:
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=parent)  # fd-based: safe against symlinks inside
    else:
        os.unlink(name, dir_fd=parent)


def _put(tar: tarfile.TarFile, root: int, member: tarfile.TarInfo, uid: int | None) -> None:
    try:
        parent, name = open_parent(root, member.name, create_mode=0o755)
    except OSError as exc:  # a parent that is a symlink (ELOOP) or a file (ENOTDIR)
        raise CheckpointError(f"refused checkpoint member {member.name!r}: a parent is not a folder ({exc})") from exc
    try:
        _put_in(tar, parent, name, member, uid)
    finally:
        if parent != root:
            os.close(parent)


def _put_in(tar: tarfile.TarFile, parent: int, name: str, member: tarfile.TarInfo, uid: int | None) -> None:
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    wanted = {"d": stat.S_ISDIR, "f": stat.S_ISREG, "l": lambda _m: False}[KIND_OF[member.type]]
    if st is not None and not wanted(st.st_mode):
        _remove(parent, name)  # another kind (or any symlink) in the way: replaced
        st = None
    mode = stat.S_IMODE(member.mode or 0o644) & 0o777  # never setuid, setgid or sticky
    if member.isdir():
        if st is None:
            os.mkdir(name, 0o700, dir_fd=parent)
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        try:
            os.fchmod(fd, mode)
            if uid is not None:
                os.fchown(fd, uid, uid)
        finally:
            os.close(fd)
        return
    if member.issym():
        os.symlink(member.linkname, name, dir_fd=parent)
        if uid is not None:
            os.chown(name, uid, uid, dir_fd=parent, follow_symlinks=False)
        _times(parent, member, name)
        return
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent)
    with os.fdopen(fd, "wb") as out:
        source = tar.extractfile(member)
        while chunk := source.read(CHUNK):  # type: ignore[union-attr]
            out.write(chunk)
        out.flush()
        os.fchmod(out.fileno(), mode)
        if uid is not None:
            os.fchown(out.fileno(), uid, uid)
        os.utime(out.fileno(), ns=(int(member.mtime * 1e9),) * 2)


def _times(root: int, member: tarfile.TarInfo, name: str | None = None) -> None:
    """Set an entry's mtime (folders after their content; symlinks themselves)."""
    ns = int(member.mtime * 1e9)
    if name is not None:
        os.utime(name, ns=(ns, ns), dir_fd=root, follow_symlinks=False)
        return
    try:
        parent, last = open_parent(root, member.name)
    except OSError:
        return
    try:
        os.utime(last, ns=(ns, ns), dir_fd=parent, follow_symlinks=False)
    finally:
        if parent != root:
            os.close(parent)
