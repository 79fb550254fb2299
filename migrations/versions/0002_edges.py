"""Weight updates and attempts: llm_servers.paused/logprobs_mode, rollouts.attempt_history.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("llm_servers") as batch:
        batch.add_column(sa.Column("paused", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(
            sa.Column("logprobs_mode", sa.String(length=32), nullable=False, server_default="raw_logprobs")
        )
    with op.batch_alter_table("rollouts") as batch:
        batch.add_column(sa.Column("attempt_history", JSON, nullable=False, server_default="[]"))


def downgrade() -> None:
    with op.batch_alter_table("rollouts") as batch:
        batch.drop_column("attempt_history")
    with op.batch_alter_table("llm_servers") as batch:
        batch.drop_column("logprobs_mode")
        batch.drop_column("paused")
