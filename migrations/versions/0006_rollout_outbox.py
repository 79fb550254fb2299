"""Rollouts get an outbox mark: committed with the insert, cleared once published.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("rollouts", sa.Column("outbox_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_rollouts_outbox",
        "rollouts",
        ["outbox_at"],
        postgresql_where=sa.text("outbox_at IS NOT NULL"),
        sqlite_where=sa.text("outbox_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_rollouts_outbox", table_name="rollouts")
    op.drop_column("rollouts", "outbox_at")
