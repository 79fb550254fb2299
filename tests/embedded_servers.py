"""Find and stop the embedded Redis servers that tests' homes leave behind.

The embedded broker's `redis-server` daemonizes (it is reparented to init), so a server that a
test's *subprocess* started (a gunicorn gateway, `raas worker`, a CLI command on a temp home)
outlives that subprocess and the test; only the process that started a server knows it
(`tasks.broker.embedded_redis.started_here`). The server works in its home's `redis/` folder, so the
test harness finds them by their working directory instead: every `redis-server` whose
folder lies under this pytest process's base temporary directory belongs to this run (never
to the machine's Redis, nor to another engineer's run, whose temp dirs are elsewhere).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)


def embedded_redis_under(root: Path) -> dict[int, Path]:
    """{pid: home} of the live `redis-server` processes whose working folder is `<home>/redis`
    with the home under `root`."""
    root = root.resolve()
    found: dict[int, Path] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/comm") as handle:
                if handle.read().strip() != "redis-server":
                    continue
            cwd = Path(os.readlink(f"/proc/{entry.name}/cwd"))
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if cwd.name == "redis" and cwd.is_relative_to(root):
            found[int(entry.name)] = cwd.parent
    return found


def stop_embedded_redis(servers: dict[int, Path]) -> int:
    """Stop these servers the way `raas broker stop` does (SHUTDOWN on the home's socket, else
    SIGTERM; SIGKILL if one hangs); returns how many were running."""
    from core.settings import Settings
    from tasks.broker import embedded_redis

    stopped = 0
    for pid, home in servers.items():
        try:
            stopped += embedded_redis.stop(Settings(home=home))
        except Exception as exc:  # a home whose settings no longer load: signal it directly
            log.warning("stopping the embedded Redis of %s by signal: %s", home, exc)
            stopped += _terminate(pid)
    return stopped


def _terminate(pid: int, timeout: float = 15.0) -> bool:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.01)
    if os.path.exists(f"/proc/{pid}"):
        os.kill(pid, signal.SIGKILL)
    return True
