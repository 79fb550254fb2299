"""Turns hold what a resumed RUN needs (appended messages, the loop's counters), a turn's
(rollout, attempt, index) becomes unique, and rollouts list the RUNs they resumed.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    json_type = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    op.add_column("turns", sa.Column("observation_messages", json_type, nullable=True))
    op.add_column("turns", sa.Column("loop_state", json_type, nullable=True))
    op.add_column("rollouts", sa.Column("resumes", json_type, nullable=True))
    op.drop_index("ix_turns_rollout", table_name="turns")
    op.create_index("uq_turns_rollout_attempt_index", "turns", ["rollout_id", "attempt", "index"], unique=True)


def downgrade() -> None:
    op.drop_index("uq_turns_rollout_attempt_index", table_name="turns")
    op.create_index("ix_turns_rollout", "turns", ["rollout_id", "attempt", "index"])
    op.drop_column("rollouts", "resumes")
    op.drop_column("turns", "loop_state")
    op.drop_column("turns", "observation_messages")
