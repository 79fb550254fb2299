"""Shared fixtures: real PostgreSQL and Redis (fail, never skip, when they are down)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

PG_ADMIN_URL = os.environ.get("RAAS_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("RAAS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.hookimpl(trylast=True)  # after pytest regroups items by fixture scope
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest files first, for `--dist loadfile` (tests/suite_order.py says why)."""
    from tests.suite_order import longest_files_first

    longest_files_first(items)


def _pg_admin_engine() -> sa.Engine:
    return sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    name = f"raas_t_{uuid.uuid4().hex[:12]}"
    admin = _pg_admin_engine()
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as exc:  # the service must be there: fail loudly
        pytest.fail(f"PostgreSQL is not reachable at {PG_ADMIN_URL}: {exc}")
    url = sa.engine.make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    yield url
    from core.db import dispose_all

    dispose_all(close=True)
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """A SQLite database file in the test's temporary folder."""
    return f"sqlite:///{tmp_path / 'raas.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def any_db_url(request) -> str:
    """Each test using it runs on SQLite and on PostgreSQL."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A unique Redis key prefix so concurrent test runs never share queues."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as exc:
        pytest.fail(f"Redis is not reachable at {REDIS_URL}: {exc}")
    prefix = f"raas-test-{uuid.uuid4().hex[:10]}:"
    yield prefix
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)
    client.close()


@pytest.fixture(autouse=True)
def _stop_embedded_redis(tmp_path_factory) -> Iterator[None]:
    """Every test that built a gateway or a Celery app on the embedded default started its
    home's Redis server (a daemon): stop the ones this process started during the test, and
    the ones its subprocesses started in a home under this run's temp dirs (a gunicorn
    gateway, a worker, a CLI command). A module-scoped service's server, started before,
    stays until its fixture stops it (or `_stop_embedded_redis_of_module` does)."""
    with _embedded_redis_stopped_after(tmp_path_factory):
        yield


@pytest.fixture(scope="module", autouse=True)
def _stop_embedded_redis_of_module(tmp_path_factory) -> Iterator[None]:
    """The same for the servers of a module's fixtures (torn down before this one)."""
    with _embedded_redis_stopped_after(tmp_path_factory):
        yield


@pytest.fixture(scope="session", autouse=True)
def _stop_embedded_redis_of_session(tmp_path_factory) -> Iterator[None]:
    """The same for session fixtures: nothing of this run's homes outlives it."""
    with _embedded_redis_stopped_after(tmp_path_factory):
        yield


@contextmanager
def _embedded_redis_stopped_after(tmp_path_factory) -> Iterator[None]:
    from tasks.broker.embedded_redis import started_here, stop_started_here
    from tests.embedded_servers import embedded_redis_under, stop_embedded_redis

    root = tmp_path_factory.getbasetemp()
    before, running = started_here(), embedded_redis_under(root)
    yield
    stop_started_here(keep=before)
    stop_embedded_redis({pid: home for pid, home in embedded_redis_under(root).items() if pid not in running})


# Private Redis/PostgreSQL for tests that restart them (never the machine's own).
from tests.private_services import (  # noqa: E402,F401 - fixtures
    make_private_postgres,
    make_private_redis,
    private_postgres,
    private_redis,
    private_redis_aof,
)
