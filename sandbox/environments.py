"""Named sandbox environments: venvs of the system interpreter (or of another Python a
registration names), with npm packages beside them when asked, bound read-only into sandboxes.

Another Python ("3.12", for harnesses that need it: `sandbox.pythons` finds it): the venv's
python is a symlink into that interpreter's base install, which the manifest records
(`base_prefix`) and the runtimes bind read-only at the same path when it is outside the
system dirs every sandbox sees (`interpreter_binds`): that folder only, nothing else of the
home it may lie under.

A venv's scripts carry absolute paths, so an environment is built at its final path on the
host and bound at that same path inside the sandbox. npm packages (harnesses shipped on npm:
Claude Code, Codex, ...) go into the same folder (`npm install --prefix`): their
`node_modules/.bin` comes first on the sandbox's PATH (`sandbox.inside.sandbox_env`) and runs
on the system node (/usr is bound into every sandbox). Platform binaries that a package ships
as optional dependencies (`@openai/codex-linux-x64`, ...) are installed for the building host.

Offline: `npm_cache` is npm's own content cache (`npm install --cache DIR`); a build with
`offline` installs from it alone (`--offline`). Fill it on a host with the registry (any build
with the same cache), then build on nodes without one from the copied or shared cache.

On a cluster the environments live in a *shared* root (`raas env build NAME --shared --root
DIR` on a login node, which has the internet or the site's wheelhouse): the root is marked
(`.raas-shared-root`) and compute nodes only use it, never build in it; a node that lacks an
environment says which and how to build it. Builds into a shared root take a lock made with
`mkdir` (atomic on NFS and Lustre, where `flock` may be node-local); node-local builds use
`flock`, which a crashed builder releases by itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from sandbox.errors import SandboxStartError
from sandbox.pythons import find_python
from sandbox.settings import DEFAULT_ENVS_ROOT

log = logging.getLogger(__name__)

MANIFEST = "raas-env.json"
SHARED_MARK = ".raas-shared-root"
SYSTEM_PYTHON = "/usr/bin/python3"


class EnvironmentMissing(SandboxStartError):
    """A named environment is not built in a root this node may not build in."""

    code = "environment_missing"


def is_shared_root(root: str | os.PathLike) -> bool:
    """True when nodes must not build in `root`: it is marked shared, or not writable."""
    base = Path(root)
    if (base / SHARED_MARK).exists():
        return True
    return base.is_dir() and not os.access(base, os.W_OK)


def build_command(
    name: str,
    packages: Sequence[str],
    root: str | os.PathLike,
    shared: bool = True,
    npm: Sequence[str] = (),
    python: str = SYSTEM_PYTHON,
) -> str:
    """The command that builds `name` into `root` (for error messages)."""
    words = [
        "raas env build",
        name,
        *([f"--python {python}"] if python != SYSTEM_PYTHON else []),
        *(f"--package {p}" for p in packages),
        *(f"--npm {p}" for p in npm),
        *(["--shared"] if shared else []),
        f"--root {root}",
    ]
    return " ".join(words)


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


def ensure_environment(
    name: str,
    packages: list[str],
    root: str | os.PathLike = DEFAULT_ENVS_ROOT,
    python: str = SYSTEM_PYTHON,
    npm: Sequence[str] = (),
    pythons: Mapping[str, str] = {},
) -> bool:
    """Build `name` with `packages` unless it is built already; True if this call built it.

    An environment built by hand (other packages) is left alone. Concurrent first uses on a
    node wait on the build lock, then find it built.
    """
    if is_built(name, root):
        return False
    if is_shared_root(root):
        raise EnvironmentMissing(
            f"sandbox environment {name!r} is not built in the shared environment root "
            f"{Path(root).resolve()}, and compute nodes never build there; build it once on a "
            f"login node: `{build_command(name, packages, Path(root).resolve(), npm=npm, python=python)}`",
            name=name,
        )
    log.info(
        "building sandbox environment %r (%s) on first use; this takes a minute",
        name,
        " ".join([*packages, *npm]) or "no packages",
    )
    started = time.monotonic()
    target = build_environment(name, packages, root=root, python=python, npm=npm, pythons=pythons)
    log.info("sandbox environment %r ready at %s (%.0f s)", name, target, time.monotonic() - started)
    return True


def _manifest(packages: Sequence[str], python: str, npm: Sequence[str] = ()) -> dict:
    """What an environment was built from (a Python-only one's manifest has no `npm`)."""
    return {"packages": sorted(packages), "python": python, **({"npm": sorted(npm)} if npm else {})}


# What every sandbox already sees of the host (bwrap's system dirs): an interpreter installed
# there needs no bind of its own.
SYSTEM_PREFIXES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")


def _built_from(manifest: dict | None) -> dict | None:
    """A manifest's build inputs (what decides a rebuild): not what was learnt while building."""
    return None if manifest is None else {k: v for k, v in manifest.items() if k != "base_prefix"}


def interpreter_binds(env_dir: str | os.PathLike | None) -> list[str]:
    """Host folders a sandbox must also see, read-only at the same path, for `env_dir`'s python
    to run: its interpreter's base install (a venv's python is a symlink into it) when that is
    outside the system dirs, e.g. pyenv's `~/.pyenv/versions/3.12.x`. Only that folder is
    bound: nothing else of its parents (a home) becomes visible."""
    manifest = _read_manifest(Path(env_dir)) if env_dir else None
    base = (manifest or {}).get("base_prefix")
    if not base or not os.path.isabs(base):
        return []
    real = os.path.realpath(base)
    if any(real == p or real.startswith(p + "/") for p in SYSTEM_PREFIXES):
        return []
    if not os.path.isdir(real):
        raise SandboxStartError(
            f"environment {env_dir} was built from the Python install {base}, which is not on this node"
        )
    return [real]


def build_environment(
    name: str,
    packages: list[str],
    root: str | os.PathLike = DEFAULT_ENVS_ROOT,
    python: str = SYSTEM_PYTHON,
    find_links: Sequence[str] = (),
    no_index: bool = False,
    shared: bool = False,
    npm: Sequence[str] = (),
    npm_cache: str | os.PathLike | None = None,
    pythons: Mapping[str, str] = {},
) -> Path:
    """Create `root/name` as a venv with `packages` (pip) and `npm` packages; a no-op when
    built with the same lists.

    `find_links`/`no_index` install from a local wheelhouse (sites whose compute or login
    nodes reach no package index), and `no_index` makes npm install from `npm_cache` alone;
    `shared` marks the root as one that nodes only read. `python` is an interpreter's path or
    a version ("3.12", found as `sandbox.pythons.find_python` says, `pythons` the operator's
    mapping); the manifest records the interpreter and its base install.
    """
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"bad environment name {name!r}")
    base = Path(root).resolve()
    base.mkdir(parents=True, exist_ok=True)
    target = base / name
    interpreter = find_python(python, pythons)  # a missing one fails here, naming it
    wanted = _manifest(packages, interpreter.executable, npm)
    if shared:
        (base / SHARED_MARK).write_text("compute nodes use these environments read-only\n")
    lock = _shared_lock if shared or is_shared_root(base) else _node_lock
    with lock(base / f".{name}.lock"):
        if _built_from(_read_manifest(target)) == wanted:
            return target
        shutil.rmtree(target, ignore_errors=True)
        subprocess.run([interpreter.executable, "-m", "venv", str(target)], check=True, capture_output=True)
        if packages:
            _pip_install(target, packages, find_links, no_index)
        if npm:
            _npm_install(target, npm, npm_cache, offline=no_index)
        (target / MANIFEST).write_text(json.dumps({**wanted, "base_prefix": interpreter.base_prefix}))
    return target


def _pip_install(target: Path, packages: Sequence[str], find_links: Sequence[str], no_index: bool) -> None:
    pip = [
        str(target / "bin" / "python3"),
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        *(["--no-index"] if no_index else []),
        *(f"--find-links={link}" for link in find_links),
        *packages,
    ]
    result = subprocess.run(pip, capture_output=True, text=True)
    if result.returncode:
        shutil.rmtree(target, ignore_errors=True)
        raise RuntimeError(f"pip install {list(packages)} failed: {result.stderr[-2000:]}")


def npm_command(
    target: Path, packages: Sequence[str], cache: str | os.PathLike | None = None, offline: bool = False
) -> list[str]:
    """`npm install` of `packages` into `target` (its `node_modules`), for the building host."""
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not on PATH: install Node.js (20 or newer) to build npm environments")
    return [
        npm,
        "install",
        "--prefix",
        str(target),
        "--no-audit",
        "--no-fund",
        "--no-update-notifier",
        "--omit=dev",
        "--loglevel=error",
        *([f"--cache={Path(cache).resolve()}"] if cache else []),
        *(["--offline"] if offline else []),
        *packages,
    ]


def _npm_install(target: Path, packages: Sequence[str], cache: str | os.PathLike | None, offline: bool) -> None:
    result = subprocess.run(npm_command(target, packages, cache, offline), capture_output=True, text=True)
    if result.returncode:
        shutil.rmtree(target, ignore_errors=True)
        raise RuntimeError(f"npm install {list(packages)} failed: {result.stderr[-2000:]}")


@contextlib.contextmanager
def _node_lock(path: Path) -> Iterator[None]:
    """One build per environment per node at a time (released if the builder dies)."""
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def _shared_lock(path: Path, wait: float = 3600.0) -> Iterator[None]:
    """One build per environment across hosts: `mkdir` is atomic on NFS and Lustre."""
    folder = path.with_suffix(".lockdir")
    deadline = time.monotonic() + wait
    while True:
        try:
            folder.mkdir()
            break
        except FileExistsError:
            if time.monotonic() > deadline:
                owner = (folder / "owner").read_text() if (folder / "owner").exists() else "?"
                raise RuntimeError(
                    f"{folder} is held by {owner} for over {wait:.0f} s; remove it if that build is dead"
                ) from None
            time.sleep(2)
    try:
        (folder / "owner").write_text(f"{socket.gethostname()} pid {os.getpid()}\n")
        yield
    finally:
        shutil.rmtree(folder, ignore_errors=True)


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
