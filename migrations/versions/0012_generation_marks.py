"""Pool-wide pause at a turn boundary: which rollout is generating on which server right now
(`rollouts.generating_on`, set before a request is sent and cleared when it returns), and the
seconds the current stage waited on a paused pool (`rollouts.paused_seconds`, not charged to
the stage's deadline; the reaper adds it to the limit).

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rollouts") as batch:
        batch.add_column(sa.Column("generating_on", sa.String(512), nullable=True))
        batch.add_column(sa.Column("paused_seconds", sa.Float(), nullable=False, server_default="0"))
    op.create_index("ix_rollouts_generating_on", "rollouts", ["generating_on"])


def downgrade() -> None:
    op.drop_index("ix_rollouts_generating_on", table_name="rollouts")
    with op.batch_alter_table("rollouts") as batch:
        batch.drop_column("paused_seconds")
        batch.drop_column("generating_on")
