"""Straggler cuts and push: group records, cut samples, job priority and callback URL, the
callback outbox.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column("jobs", sa.Column("group_size", sa.Integer, nullable=True))
    op.add_column("jobs", sa.Column("priority", sa.Integer, nullable=False, server_default="0"))
    op.add_column("jobs", sa.Column("callback_url", sa.String(2048), nullable=True))
    op.add_column("rollouts", sa.Column("cut_reason", sa.String(256), nullable=True))
    op.create_table(
        "groups",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("instance_id", sa.String(256), primary_key=True),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("timeout", sa.Float, nullable=True),
        sa.Column("status", sa.String(16), nullable=False, server_default="open"),
        sa.Column("members", JSONType, nullable=False),
        sa.Column("cut", JSONType, nullable=False),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("closer", sa.String(32), nullable=True),
    )
    op.create_index("ix_groups_deadline", "groups", ["status", "deadline_at"])
    op.create_table(
        "callbacks",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("event", sa.String(16), nullable=False),
        sa.Column("payload", JSONType, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_callbacks_next", "callbacks", ["next_at"])


def downgrade() -> None:
    op.drop_index("ix_callbacks_next", table_name="callbacks")
    op.drop_table("callbacks")
    op.drop_index("ix_groups_deadline", table_name="groups")
    op.drop_table("groups")
    op.drop_column("rollouts", "cut_reason")
    op.drop_column("jobs", "callback_url")
    op.drop_column("jobs", "priority")
    op.drop_column("jobs", "group_size")
