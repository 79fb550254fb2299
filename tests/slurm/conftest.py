"""Module-scoped database for the Slurm tier (one cluster per proctrack runs several jobs)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.conftest import PG_ADMIN_URL


@pytest.fixture(scope="module")
def pg_url_module() -> Iterator[str]:
    """A fresh PostgreSQL database for one module, dropped afterwards."""
    name = f"raas_slurm_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    yield sa.engine.make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    from core.db import dispose_all

    dispose_all(close=True)
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()
