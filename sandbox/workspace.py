"""Reading a sandbox's workspace from the host without trusting anything in it.

After RUN the workspace is the agent's: it may hold symlinks to host files (`x -> /etc/shadow`),
FIFOs that block a reader, device nodes, millions of tiny files or one huge one. Everything
here walks with `lstat` (a symlink is never followed, a directory symlink never entered),
opens regular files with `O_NOFOLLOW | O_NONBLOCK` and checks them again with `fstat`, and
stops at caps on entries, file size and total bytes. Only processes of a *stopped* sandbox
can no longer race these checks, so callers stop the sandbox first.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

# Never part of an artifact: VCS metadata and caches the agent's own runs leave behind (aider
# keeps its repo map's tags in the git root, with no option to move them).
SKIP_DIRS = frozenset({".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".hypothesis", ".aider.tags.cache.v4"})
SKIP_SUFFIXES = (".pyc", ".pyo")


@dataclass(frozen=True)
class WalkLimits:
    """Caps of one walk; past them the walk stops and says so."""

    max_entries: int = 200_000
    max_file_bytes: int = 2 * 1024 * 1024
    max_total_bytes: int = 16 * 1024 * 1024


@dataclass
class Entry:
    """One regular file found by a walk (relative POSIX path, size, executable bit)."""

    path: str
    size: int
    executable: bool


@dataclass
class Walk:
    """Regular files under a root, plus what was left out and why."""

    files: dict[str, Entry] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # path -> reason
    truncated: bool = False


def walk(root: str, limits: WalkLimits = WalkLimits()) -> Walk:
    """Every regular file under `root` (symlinks, FIFOs, devices and sockets are skipped)."""
    out, seen = Walk(), 0
    for rel, st in _entries(root):
        seen += 1
        if seen > limits.max_entries:
            out.truncated = True
            out.skipped["*"] = f"more than {limits.max_entries} entries"
            break
        if stat.S_ISREG(st.st_mode):
            out.files[rel] = Entry(rel, st.st_size, bool(st.st_mode & 0o111))
        elif not stat.S_ISDIR(st.st_mode):
            out.skipped[rel] = "not a regular file (symlink, fifo, device or socket)"
    return out


def _entries(root: str) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of everything below `root`, depth first, skipping SKIP_DIRS."""
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            with os.scandir(os.path.join(root, rel_dir) if rel_dir else root) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if entry.name not in SKIP_DIRS:
                    stack.append(rel)
                continue
            if entry.name.endswith(SKIP_SUFFIXES):
                continue
            yield rel, st


def read_regular(root: str, rel: str, max_bytes: int) -> bytes | None:
    """The bytes of a regular file below `root`, or None if it is not one or is too large.

    Every directory on the way is checked with lstat, so a symlinked parent cannot lead out.
    """
    parts = rel.split("/")
    if not parts or any(p in ("", ".", "..") for p in parts):
        return None
    current = root
    for part in parts[:-1]:
        current = os.path.join(current, part)
        try:
            if not stat.S_ISDIR(os.lstat(current).st_mode):
                return None
        except OSError:
            return None
    try:
        fd = os.open(os.path.join(current, parts[-1]), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            total += len(chunk)
        return None
    finally:
        os.close(fd)


def disk_usage(root: str, max_entries: int = 1_000_000) -> tuple[int, int]:
    """(bytes allocated, entries) below `root`, never following links; stops at max_entries."""
    used, count = 0, 0
    stack = [root]
    while stack and count <= max_entries:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    count += 1
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    used += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
        except OSError:
            continue
    return used, count
