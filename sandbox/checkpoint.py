"""Workspace checkpoints: what a workspace changed since a manifest of it, saved as one tar.

The manifest (`scan`) maps each relative path of the workspace to its type, mode, size,
mtime_ns and ctime_ns, taken once right after INIT. A checkpoint (`save`) is a tar of the
entries that are new or differ from it (regular files, directories, symlinks stored as
symlinks), preceded by a JSON member naming the turn and the paths deleted since. The ctime is
what makes the comparison sound: the agent can forge a file's mtime (`touch -d`), not its
ctime, so a changed file always differs. Everything is read through directory descriptors with
`O_NOFOLLOW` on every component: a symlink the agent planted (or swaps in while the scan runs)
is recorded as a symlink and never read through, so no host file outside the workspace can
reach a checkpoint. Restoring one is `sandbox.checkpoint_restore`.

A checkpoint over `max_bytes` of file content is not written (the previous one stays the
latest good one); a new one is written to a temporary name, fsynced and renamed over the old.
"""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

META = ".raas-checkpoint.json"  # the first member: turn, deleted paths, format version
VERSION = 1
KINDS = {stat.S_IFREG: "f", stat.S_IFDIR: "d", stat.S_IFLNK: "l"}  # anything else is left out
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

Entry = tuple[str, int, int, int, int]  # kind, mode, size, mtime_ns, ctime_ns
Manifest = dict[str, Entry]


class CheckpointError(Exception):
    """A checkpoint that cannot be written or is refused on restore (the message says why)."""


@dataclass(frozen=True)
class Saved:
    """What one `save` did: written or not (`skipped` says why), its size and what it holds."""

    turn: int
    written: bool
    bytes: int = 0  # file content in the checkpoint (what the bound applies to)
    entries: int = 0
    deleted: int = 0
    seconds: float = 0.0
    skipped: str | None = None


def scan(workspace: str | Path) -> Manifest:
    """Every entry under `workspace` (relative posix path -> kind, mode, size, mtime_ns,
    ctime_ns), walked by descriptor without following any symlink."""
    out: Manifest = {}
    root = os.open(workspace, DIR_FLAGS)
    try:
        _scan_dir(root, "", out)
    finally:
        os.close(root)
    return out


def _scan_dir(fd: int, prefix: str, out: Manifest) -> None:
    with os.scandir(fd) as entries:
        listed = [(e.name, e.stat(follow_symlinks=False)) for e in entries]
    for name, st in listed:
        kind = KINDS.get(stat.S_IFMT(st.st_mode))
        if kind is None:  # fifos, sockets, devices: not workspace content
            continue
        rel = prefix + name
        out[rel] = (kind, stat.S_IMODE(st.st_mode), st.st_size if kind == "f" else 0, st.st_mtime_ns, st.st_ctime_ns)
        if kind == "d":
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError:  # swapped for something else since it was listed: seen next time
                continue
            try:
                _scan_dir(sub, rel + "/", out)
            finally:
                os.close(sub)


def changes(manifest: Manifest, now: Manifest) -> tuple[list[str], list[str]]:
    """(new or changed paths, deleted paths), each sorted so a parent precedes its children."""
    changed = sorted(path for path, entry in now.items() if manifest.get(path) != tuple(entry))
    deleted = sorted(path for path in manifest if path not in now)
    return changed, deleted


def save(workspace: str | Path, manifest: Manifest, dest: str | Path, turn: int, max_bytes: int) -> Saved:
    """Write the checkpoint of `workspace` after `turn` to `dest` (atomically), unless its file
    content is over `max_bytes`: then nothing is written and `skipped` says so."""
    started = time.monotonic()
    now = scan(workspace)
    changed, deleted = changes(manifest, now)
    size = sum(now[path][2] for path in changed if now[path][0] == "f")
    if size > max_bytes:
        return Saved(turn, False, size, len(changed), len(deleted), time.monotonic() - started, "over_bound")
    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        _write(workspace, now, changed, deleted, tmp, turn, max_bytes)
        os.replace(tmp, dest)
    except (OSError, CheckpointError) as exc:
        tmp.unlink(missing_ok=True)
        reason = "over_bound" if isinstance(exc, CheckpointError) else f"unreadable: {exc}"
        return Saved(turn, False, size, len(changed), len(deleted), time.monotonic() - started, reason)
    _fsync_dir(dest.parent)
    return Saved(turn, True, size, len(changed), len(deleted), time.monotonic() - started)


def _write(
    workspace: str | Path,
    now: Manifest,
    changed: list[str],
    deleted: list[str],
    tmp: Path,
    turn: int,
    max_bytes: int,
) -> None:
    """The tar: the meta member, then each changed entry as the scan saw it (a file that grew
    since is cut at its scanned size; one that shrank fails the save, the next turn tries
    again)."""
    meta = json.dumps({"version": VERSION, "turn": turn, "deleted": deleted}).encode()
    root = os.open(workspace, DIR_FLAGS)
    written = 0
    try:
        with open(tmp, "wb") as raw:
            with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
                info = tarfile.TarInfo(META)
                info.size = len(meta)
                tar.addfile(info, io.BytesIO(meta))
                for path in changed:
                    written += _add(tar, root, path, now[path])
                    if written > max_bytes:
                        raise CheckpointError(f"grew over {max_bytes} bytes while saving")
            raw.flush()
            os.fsync(raw.fileno())
    finally:
        os.close(root)


def _add(tar: tarfile.TarFile, root: int, path: str, entry: Entry) -> int:
    """Add one entry, read by descriptor; the bytes of file content added."""
    kind, mode, size, mtime_ns, _ = entry
    info = tarfile.TarInfo(path)
    info.mode, info.mtime = mode, mtime_ns / 1e9
    parent, name = open_parent(root, path)
    try:
        if kind == "d":
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
            return 0
        if kind == "l":
            info.type, info.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=parent)
            tar.addfile(info)
            return 0
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise OSError(f"{path} is no longer a regular file")
            info.type, info.size = tarfile.REGTYPE, size
            tar.addfile(info, f)
        return size
    finally:
        if parent != root:
            os.close(parent)


def open_parent(root: int, path: str, create_mode: int | None = None) -> tuple[int, str]:
    """(descriptor of the folder holding `path`, its last component), walking from `root`
    without following a symlink (ELOOP/ENOTDIR if a component is one); missing folders are
    made with `create_mode` when given. The caller closes the descriptor unless it is `root`."""
    *parts, name = path.split("/")
    fd = root
    try:
        for part in parts:
            if create_mode is not None:
                try:
                    os.mkdir(part, create_mode, dir_fd=fd)
                except FileExistsError:
                    pass
            sub = os.open(part, DIR_FLAGS, dir_fd=fd)
            if fd != root:
                os.close(fd)
            fd = sub
    except BaseException:
        if fd != root:
            os.close(fd)
        raise
    return fd, name


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(manifest: Manifest, dest: str | Path) -> None:
    """Store a manifest atomically (JSON; lone surrogates of undecodable names survive)."""
    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, dest)


def read_manifest(path: str | Path) -> Manifest:
    """A stored manifest (entries as tuples, as `scan` returns them)."""
    with open(path) as f:
        return {k: tuple(v) for k, v in json.load(f).items()}  # type: ignore[misc]
