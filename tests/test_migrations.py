"""Migrations build the schema from empty on SQLite and PostgreSQL, and go back down."""

from __future__ import annotations

import sqlalchemy as sa

from core.models import Base
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


def test_models_and_migrations_agree(sqlite_url: str) -> None:
    """Every model change comes with a revision: autogenerate finds nothing left to do."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    upgrade(sqlite_url)
    engine = sa.create_engine(sqlite_url)
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    engine.dispose()
