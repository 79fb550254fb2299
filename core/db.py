"""Engines and sessions: one engine per process per URL, safe across fork, SQLite in WAL mode.

SQLite gets WAL plus a busy timeout so the gateway and every stage pool can write at once; all
writes are short transactions (no transaction is held across a stage). After `fork()` the child
drops the parent's pooled connections instead of sharing sockets with it.

PostgreSQL connections are a small pool per process (`db_pool_size`, default 4) shared by all
its threads: a RUN pool of 80 slots holds at most 4, because a slot holds a connection only
for one short transaction, never across a hook, a tool call or a generation. A thread that
finds the pool busy waits (`db_pool_timeout`) instead of failing. Nothing relies on session
state (no SET, LISTEN or session advisory lock; `pg_advisory_xact_lock` ends with its
transaction) or on server-side prepared statements (`prepare_threshold=None`), so the URL may
point at PgBouncer in transaction mode.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from core.json_columns import dumps_bytes, dumps_text, loads
from core.settings import Settings

SQLITE_BUSY_TIMEOUT_MS = 30_000
POOL_RECYCLE_S = 1800


@dataclass(frozen=True)
class PoolOptions:
    """How many PostgreSQL connections one process keeps, and how long a thread waits."""

    size: int
    overflow: int
    timeout: float
    pre_ping: bool = True

    @classmethod
    def from_settings(cls, settings: Settings) -> PoolOptions:
        """The options `settings` name."""
        return cls(settings.db_pool_size, settings.db_pool_overflow, settings.db_pool_timeout)


def _default_options() -> PoolOptions:
    fields = Settings.model_fields
    return PoolOptions(
        fields["db_pool_size"].default, fields["db_pool_overflow"].default, fields["db_pool_timeout"].default
    )


_lock = threading.Lock()
_options: PoolOptions = _default_options()
_engines: dict[tuple[str, PoolOptions], Engine] = {}
_factories: dict[tuple[str, PoolOptions], sessionmaker[Session]] = {}


def normalize_url(url: str) -> str:
    """Use psycopg 3 for bare `postgresql://` URLs (the driver we install)."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:  # untyped: DBAPI types
        # Let SQLAlchemy issue BEGIN itself, and make it IMMEDIATE so writers queue on the
        # busy timeout instead of failing on a read->write lock upgrade.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(url: str, options: PoolOptions | None = None) -> Engine:
    """A new engine for `url` with the pragmas and pool settings raas relies on, and JSON
    columns written and read by `core.json_columns`.

    SQLite keeps SQLAlchemy's default pool (a file has no connection limit; its writers queue
    on the busy timeout); `options` apply to server databases.
    """
    url = normalize_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
            json_serializer=dumps_text,
            json_deserializer=loads,
        )
        _configure_sqlite(engine)
        return engine
    options = options or _options
    connect_args = {"prepare_threshold": None} if parsed.get_driver_name() == "psycopg" else {}
    return create_engine(
        url,
        pool_pre_ping=options.pre_ping,
        pool_size=options.size,
        max_overflow=options.overflow,
        pool_timeout=options.timeout,
        pool_recycle=POOL_RECYCLE_S,
        connect_args=connect_args,
        json_serializer=dumps_bytes if parsed.get_driver_name() == "psycopg" else dumps_text,
        json_deserializer=loads,
    )


def configure_pool(settings: Settings) -> None:
    """Size this process's connection pools from settings (engines made from now on).

    Called at start-up by the gateway, each stage worker and the reaper; a process that never
    calls it gets the settings' defaults.
    """
    global _options
    with _lock:
        _options = replace(PoolOptions.from_settings(settings), pre_ping=_options.pre_ping)


def use_pre_ping(enabled: bool) -> None:
    """Choose whether new engines test connections on checkout.

    The gateway keeps it (a request after a database restart then just works). Stage workers
    turn it off: it costs a round trip on every checkout, a third of a stage's queries. There a
    connection broken by a restart fails its statement, SQLAlchemy drops the whole pool, and
    the stage's retry path (or the reaper) redoes the work.
    """
    global _options
    with _lock:
        _options = replace(_options, pre_ping=enabled)


def _key(url: str) -> tuple[str, PoolOptions]:
    return normalize_url(url), _options


def get_engine(url: str) -> Engine:
    """The process-wide engine for `url` under the current pool options (made on first use)."""
    with _lock:
        key = _key(url)
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = make_engine(key[0], key[1])
            _factories[key] = sessionmaker(engine, expire_on_commit=False)
        return engine


def session_factory(url: str) -> sessionmaker[Session]:
    """The sessionmaker bound to the engine for `url`."""
    with _lock:
        factory = _factories.get(_key(url))
    if factory is not None:  # the hot path: one dict lookup
        return factory
    get_engine(url)
    with _lock:
        return _factories[_key(url)]


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """A short transaction: commit on success, roll back on error, always close."""
    session = session_factory(url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def dispose_all(close: bool = False) -> None:
    """Forget pooled connections (after fork: `close=False` leaves the parent's alone)."""
    with _lock:
        for engine in _engines.values():
            engine.dispose(close=close)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: dispose_all(close=False))
