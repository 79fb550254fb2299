"""The swe artifact: the agent's file changes against the base commit, computed without git.

Host `git` never runs on the agent's `.git` (its config can name hooks, filters, an fsmonitor,
a pager or an external diff: host code execution). Instead the dead workspace is compared
file by file with a clean checkout of the base commit (`sandbox.workspace`: no link followed,
sizes capped). Before grading, `split_changes` drops every change to test files and test
infrastructure, and `apply_changes` writes the rest into a fresh checkout.
"""

from __future__ import annotations

import base64
import difflib
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

from sandbox.workspace import WalkLimits, read_regular, walk

MAX_PATCH_CHARS = 200_000
_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
# Files that configure or extend pytest/Python itself: never the agent's to change.
INFRA_NAMES = frozenset(
    {
        "conftest.py",
        "pytest.ini",
        ".pytest.ini",
        "tox.ini",
        "setup.cfg",
        "pyproject.toml",
        "sitecustomize.py",
        "usercustomize.py",
    }
)
# A new module with one of these names could be imported instead of the real one.
SHADOWABLE = frozenset(sys.stdlib_module_names) | {
    "pytest",
    "_pytest",
    "py",
    "pluggy",
    "iniconfig",
    "packaging",
    "xdist",
}


def workspace_changes(agent_ws: str, clean_ws: str, limits: WalkLimits = WalkLimits()) -> dict[str, Any]:
    """{"files": {path: change}, "skipped": {path: reason}}; a change is {"text": ...},
    {"base64": ...} (either with "executable") or {"deleted": true}."""
    agent, clean = walk(agent_ws, limits), walk(clean_ws, limits)
    files: dict[str, dict[str, Any]] = {}
    skipped = dict(agent.skipped)
    total = 0
    for rel, entry in agent.files.items():
        data = read_regular(agent_ws, rel, limits.max_file_bytes)
        if data is None:
            skipped[rel] = f"larger than {limits.max_file_bytes} bytes or unreadable"
            continue
        base = clean.files.get(rel)
        if (
            base is not None
            and base.executable == entry.executable
            and base.size == len(data)
            and read_regular(clean_ws, rel, limits.max_file_bytes) == data
        ):
            continue
        total += len(data)
        if total > limits.max_total_bytes:
            skipped[rel] = f"changes exceed {limits.max_total_bytes} bytes in total"
            continue
        files[rel] = _encode(data, entry.executable)
    for rel in clean.files:
        if rel not in agent.files and rel not in skipped and not agent.truncated:
            files[rel] = {"deleted": True}
    return {"files": files, "skipped": skipped}


def _encode(data: bytes, executable: bool) -> dict[str, Any]:
    try:
        change: dict[str, Any] = {"text": data.decode("utf-8")}
    except UnicodeDecodeError:
        change = {"base64": base64.b64encode(data).decode()}
    if executable:
        change["executable"] = True
    return change


def _content(change: dict[str, Any]) -> bytes:
    if "text" in change:
        return str(change["text"]).encode("utf-8")
    return base64.b64decode(str(change.get("base64", "")))


def test_patch_paths(test_patch: str) -> set[str]:
    """Every path a test patch touches."""
    return {p for pair in _DIFF_HEADER.findall(test_patch) for p in pair}


def drop_reason(path: str, is_new: bool, test_paths: set[str]) -> str | None:
    """Why a change to `path` must not reach grading, or None when it may."""
    parts = path.split("/")
    name = parts[-1]
    if path in test_paths:
        return "touched by test_patch"
    if name in INFRA_NAMES:
        return "test configuration"
    if name.endswith(".pth"):
        return "site .pth file"
    stem = name[:-3] if name.endswith(".py") else None
    if is_new and (stem in SHADOWABLE or (len(parts) > 1 and parts[0] in SHADOWABLE)):
        return "new module shadowing a standard or test library"
    return None


def split_changes(
    changes: dict[str, dict[str, Any]], base_paths: set[str], test_paths: set[str]
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """(kept changes, {dropped path: reason})."""
    kept, dropped = {}, {}
    for path, change in sorted(changes.items()):
        reason = drop_reason(path, path not in base_paths, test_paths) if _safe(path) else "not a plain relative path"
        if reason is None:
            kept[path] = change
        else:
            dropped[path] = reason
    return kept, dropped


def _safe(path: str) -> bool:
    parts = path.split("/")
    return (
        bool(path) and not path.startswith("/") and ".git" not in parts and all(p not in ("", ".", "..") for p in parts)
    )


def apply_changes(workspace: str, changes: dict[str, dict[str, Any]]) -> None:
    """Write kept changes into a fresh checkout; a symlinked parent is never written through."""
    for path, change in changes.items():
        target = Path(workspace, path)
        if not _parents_are_dirs(workspace, path):
            continue
        if change.get("deleted"):
            try:
                if stat.S_ISREG(os.lstat(target).st_mode):
                    target.unlink()
            except OSError:
                pass
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(target, flags, 0o755 if change.get("executable") else 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(_content(change))
        os.chmod(target, 0o755 if change.get("executable") else 0o644)


def _parents_are_dirs(root: str, path: str) -> bool:
    current = root
    for part in path.split("/")[:-1]:
        current = os.path.join(current, part)
        try:
            if not stat.S_ISDIR(os.lstat(current).st_mode):
                return False
        except FileNotFoundError:
            return True  # created fresh below
    return True


def display_patch(clean_ws: str, changes: dict[str, dict[str, Any]]) -> str:
    """A unified diff of the kept changes (for people and trainers; grading never reads it)."""
    chunks = []
    for path, change in sorted(changes.items()):
        old = read_regular(clean_ws, path, 4 * 1024 * 1024)
        new = None if change.get("deleted") else _content(change)
        if (old is not None and b"\0" in old) or (new is not None and "text" not in change):
            chunks.append(f"diff --git a/{path} b/{path}\nBinary files differ\n")
            continue
        a = (old or b"").decode("utf-8", "replace").splitlines(keepends=True)
        b = (new or b"").decode("utf-8", "replace").splitlines(keepends=True)
        body = "".join(
            difflib.unified_diff(
                a, b, "/dev/null" if old is None else f"a/{path}", "/dev/null" if new is None else f"b/{path}"
            )
        )
        chunks.append(f"diff --git a/{path} b/{path}\n{body}")
    patch = "".join(c if c.endswith("\n") else c + "\n" for c in chunks)
    return patch[:MAX_PATCH_CHARS]
