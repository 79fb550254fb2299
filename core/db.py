"""Engines and sessions: one engine per process per URL, safe across fork, SQLite in WAL mode.

SQLite gets WAL plus a busy timeout so the gateway and every stage pool can write at once; all
writes are short transactions (no transaction is held across a stage). After `fork()` the child
drops the parent's pooled connections instead of sharing sockets with it.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BUSY_TIMEOUT_MS = 30_000

_lock = threading.Lock()
_engines: dict[str, Engine] = {}
_factories: dict[str, sessionmaker[Session]] = {}


def normalize_url(url: str) -> str:
    """Use psycopg 3 for bare `postgresql://` URLs (the driver we install)."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:  # noqa: ANN001 - DBAPI types
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
    def _on_begin(conn) -> None:  # noqa: ANN001
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(url: str) -> Engine:
    """A new engine for `url` with the pragmas and pool settings raas relies on."""
    url = normalize_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        _configure_sqlite(engine)
        return engine
    return create_engine(url, pool_pre_ping=_pre_ping, pool_size=10, max_overflow=20,
                         pool_recycle=1800)


_pre_ping = True


def use_pre_ping(enabled: bool) -> None:
    """Choose whether new engines test connections on checkout.

    The gateway keeps it (a request after a database restart then just works). Stage workers
    turn it off: it costs a round trip on every checkout, a third of a stage's queries. There a
    connection broken by a restart fails its statement, SQLAlchemy drops the whole pool, and
    the stage's retry path (or the reaper) redoes the work.
    """
    global _pre_ping
    _pre_ping = enabled


def get_engine(url: str) -> Engine:
    """The process-wide engine for `url` (created on first use)."""
    url = normalize_url(url)
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _engines[url] = make_engine(url)
            _factories[url] = sessionmaker(engine, expire_on_commit=False)
        return engine


def session_factory(url: str) -> sessionmaker[Session]:
    """The sessionmaker bound to the engine for `url`."""
    get_engine(url)
    return _factories[normalize_url(url)]


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
