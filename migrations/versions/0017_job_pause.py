"""Job pause (issue 37): a paused job's queued rollouts are not claimed by INIT until it resumes;
set by the operator or trainer (`POST /v1/jobs/{id}/pause`) or by a critical health alert of a
job with `health.on_critical: pause` (`tasks.writes.pauses`).

Revision ID: 0017
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("pause_reason", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("pause_reason")
        batch.drop_column("paused_at")
