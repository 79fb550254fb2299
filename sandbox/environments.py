"""Named Python environments: venvs of the system interpreter, bound read-only into sandboxes.

A venv's scripts carry absolute paths, so an environment is built at its final path on the
host and bound at that same path inside the sandbox.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

from sandbox.errors import SandboxStartError
from sandbox.settings import DEFAULT_ENVS_ROOT

log = logging.getLogger(__name__)

MANIFEST = "raas-env.json"
SYSTEM_PYTHON = "/usr/bin/python3"


def resolve_env(name: str | None, root: str | os.PathLike = DEFAULT_ENVS_ROOT) -> str | None:
    """The absolute folder of a named (or absolute-path) environment; it must be built."""
    if name is None:
        return None
    path = Path(name) if os.path.isabs(name) else Path(root) / name
    if not (path / "bin" / "python3").exists():
        known = ", ".join(e["name"] for e in list_environments(root)) or "none"
        raise SandboxStartError(
            f"python environment {name!r} is not built at {path} (built: {known}); "
            f"run `raas env build {name} --package ...`"
        )
    return str(path.resolve())


def is_built(name: str, root: str | os.PathLike = DEFAULT_ENVS_ROOT) -> bool:
    """True when environment `name` is complete (its manifest is written last)."""
    path = Path(name) if os.path.isabs(name) else Path(root) / name
    return _read_manifest(path) is not None


def ensure_environment(name: str, packages: list[str], root: str | os.PathLike = DEFAULT_ENVS_ROOT,
                       python: str = SYSTEM_PYTHON) -> bool:
    """Build `name` with `packages` unless it is built already; True if this call built it.

    An environment built by hand (other packages) is left alone. Concurrent first uses on a
    node wait on the build lock, then find it built.
    """
    if is_built(name, root):
        return False
    log.info("building sandbox environment %r (%s) on first use; this takes a minute",
             name, " ".join(packages) or "no packages")
    started = time.monotonic()
    target = build_environment(name, packages, root=root, python=python)
    log.info("sandbox environment %r ready at %s (%.0f s)", name, target,
             time.monotonic() - started)
    return True


def _manifest(packages: list[str], python: str) -> dict:
    return {"packages": sorted(packages), "python": python}


def build_environment(name: str, packages: list[str], root: str | os.PathLike = DEFAULT_ENVS_ROOT,
                      python: str = SYSTEM_PYTHON) -> Path:
    """Create `root/name` as a venv with `packages`; a no-op when built with the same list."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"bad environment name {name!r}")
    base = Path(root).resolve()
    base.mkdir(parents=True, exist_ok=True)
    target = base / name
    wanted = _manifest(packages, python)
    with open(base / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per environment per node at a time
        if _read_manifest(target) == wanted:
            return target
        shutil.rmtree(target, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(target)], check=True, capture_output=True)
        if packages:
            pip = [str(target / "bin" / "python3"), "-m", "pip", "install", "-q",
                   "--disable-pip-version-check", *packages]
            result = subprocess.run(pip, capture_output=True, text=True)
            if result.returncode:
                shutil.rmtree(target, ignore_errors=True)
                raise RuntimeError(f"pip install {packages} failed: {result.stderr[-2000:]}")
        (target / MANIFEST).write_text(json.dumps(wanted))
    return target


def _read_manifest(target: Path) -> dict | None:
    try:
        return json.loads((target / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def list_environments(root: str | os.PathLike = DEFAULT_ENVS_ROOT) -> list[dict]:
    """Built environments with their package lists."""
    base = Path(root)
    found = []
    for path in sorted(base.iterdir()) if base.is_dir() else []:
        manifest = _read_manifest(path)
        if manifest is not None:
            found.append({"name": path.name, "path": str(path), **manifest})
    return found
