"""Migrations build the schema from empty on SQLite and PostgreSQL, and go back down."""
from __future__ import annotations

import sqlalchemy as sa

from app.models import Base
from migrations.runner import downgrade, upgrade


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_from_empty_then_down_then_up(any_db_url: str) -> None:
    upgrade(any_db_url)
    assert set(Base.metadata.tables) <= _tables(any_db_url)
    downgrade(any_db_url, "base")
    assert not set(Base.metadata.tables) & _tables(any_db_url)
    upgrade(any_db_url)
    assert set(Base.metadata.tables) <= _tables(any_db_url)
