"""Environment validation runs and the quarantine lists they write (`validations`); a job's
health alerts (`job_alerts`).

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "validations",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("name", sa.String(128), nullable=True),
        sa.Column("agent", sa.String(64), nullable=False),
        sa.Column("k", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("request", JSONType, nullable=False),
        sa.Column("report", JSONType, nullable=False),
        sa.Column("quarantined", JSONType, nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("seconds", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_validations_owner_name", "validations", ["owner", "name"])
    op.create_table(
        "job_alerts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("threshold", sa.Float(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("weight_version", sa.String(256), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("raised_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cleared_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_job_alerts_job", "job_alerts", ["job_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_job_alerts_job", table_name="job_alerts")
    op.drop_table("job_alerts")
    op.drop_index("ix_validations_owner_name", table_name="validations")
    op.drop_table("validations")
