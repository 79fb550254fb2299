"""Per-sandbox cgroups (pids + memory) when this user may create them: v2 delegated or v1 writable.

Root ignores RLIMIT_NPROC, so as root a cgroup is the only real process limit; rootless
users get RLIMIT_NPROC counted per user namespace instead (see `sandbox.limits`).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

from sandbox.spec import SandboxLimits

log = logging.getLogger(__name__)


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fstype, super options) of cgroup mounts."""
    found = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            left, _, right = line.partition(" - ")
            fstype, _source, options = (right.split() + ["", ""])[:3]
            if fstype in ("cgroup", "cgroup2"):
                found.append((left.split()[4], fstype, set(options.split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """Controller (or '' for v2) -> this process's cgroup path."""
    paths = {}
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            _hid, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    return paths


def _parents(override: str | os.PathLike | None = None) -> dict[str, Path]:
    """Controller -> a writable directory where a child cgroup with that controller can live
    (`override`: the operator's cgroup v2 parent instead of our own cgroup)."""
    own, parents = _own_paths(), {}
    for mount, fstype, options in _mounts():
        if fstype == "cgroup2":
            base = Path(override) if override else Path(mount + own.get("", "/"))
            try:
                enabled = (base / "cgroup.subtree_control").read_text().split()
            except OSError:
                continue
            for controller in ("pids", "memory"):
                if controller in enabled and os.access(base, os.W_OK):
                    parents.setdefault(controller, base)
            continue
        for controller in ("pids", "memory"):
            if controller in options and controller in own:
                base = Path(mount + own[controller])
                if os.access(base, os.W_OK):
                    parents[controller] = base
    return parents


def usable_controllers(parent: str | os.PathLike | None = None) -> dict[str, str]:
    """Controller -> the folder sandbox cgroups would be created under (what `raas doctor`
    reports: without `memory` a sandbox's memory limit is RLIMIT_AS only)."""
    return {controller: str(path) for controller, path in _parents(parent).items()}


def create(name: str, limits: SandboxLimits, parent: str | os.PathLike | None = None) -> list[str]:
    """Create cgroups limiting pids and memory under `parent` (default our own cgroup); returns
    their directories (maybe none)."""
    made: dict[Path, None] = {}
    for controller, base in _parents(parent).items():
        path = base / f"raas-{name}"
        try:
            path.mkdir(exist_ok=True)
            _configure(path, controller, limits)
        except OSError as exc:
            log.warning("cannot use cgroup %s for %s: %s", path, controller, exc)
            continue
        made[path] = None
    return [str(path) for path in made]


def _configure(path: Path, controller: str, limits: SandboxLimits) -> None:
    memory = limits.memory_mb * 1024 * 1024
    files = {
        "pids": [("pids.max", str(limits.max_procs))],
        "memory": [
            ("memory.max", str(memory)),
            ("memory.swap.max", "0"),
            ("memory.limit_in_bytes", str(memory)),
            ("memory.memsw.limit_in_bytes", str(memory)),
        ],
    }[controller]
    for filename, value in files:
        if (path / filename).exists():
            try:
                (path / filename).write_text(value)
            except OSError:
                if filename in ("pids.max", "memory.max", "memory.limit_in_bytes"):
                    raise


def join_prefix(paths: list[str]) -> list[str]:
    """An argv prefix that moves the command into the cgroups before it runs (no fork race)."""
    if not paths:
        return []
    script = "; ".join(f'echo $$ > "${i + 1}"/cgroup.procs' for i in range(len(paths)))
    return ["/bin/sh", "-ec", f'{script}; shift {len(paths)}; exec "$@"', "raas-cgroup", *paths]


def pids_current(paths: list[str]) -> int | None:
    """Processes in the sandbox's pids cgroup right now."""
    for path in paths:
        try:
            return int(Path(path, "pids.current").read_text())
        except OSError:
            continue
    return None


def oom_kills(paths: list[str]) -> int:
    """Processes the kernel OOM-killed in the sandbox's memory cgroup so far (v2 or v1)."""
    for path in paths:
        for name in ("memory.events", "memory.oom_control"):
            try:
                text = Path(path, name).read_text()
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return 0


def pids_limit_hits(paths: list[str]) -> int:
    """Forks the sandbox's pids cgroup refused at `pids.max` so far (cgroup v2)."""
    for path in paths:
        try:
            text = Path(path, "pids.events").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "max":
                return int(value)
    return 0


def destroy(paths: list[str], timeout: float = 5.0) -> None:
    """Kill whatever is left in the cgroups and remove them."""
    end = time.monotonic() + timeout
    for path in paths:
        while time.monotonic() < end:
            kill = Path(path, "cgroup.kill")
            if kill.exists():
                try:
                    kill.write_text("1")
                except OSError:
                    pass
            try:
                pids = [int(x) for x in Path(path, "cgroup.procs").read_text().split()]
            except OSError:
                break  # already gone
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.rmdir(path)
                break
            except OSError:
                time.sleep(0.01)
