"""Node liveness and queue consumers: `nodes` beaten by each node's reaper and workers,
`queue_consumers` beaten by each worker process.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("beat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_table(
        "queue_consumers",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("node", sa.String(128), nullable=False),
        sa.Column("queue", sa.String(200), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("beat_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_queue_consumers_queue", "queue_consumers", ["queue"])


def downgrade() -> None:
    op.drop_index("ix_queue_consumers_queue", table_name="queue_consumers")
    op.drop_table("queue_consumers")
    op.drop_table("nodes")
