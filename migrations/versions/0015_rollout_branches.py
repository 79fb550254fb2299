"""Rollout branches (issue 38): a rollout started from another rollout's turn k names its
parent and the turn (`app.branches`); the parent's branches are listed by an index.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # No foreign key: a branch stays readable (and names where it came from) whatever happens
    # to its parent's job; the parent is looked up by id, scoped to the owner, when asked.
    op.add_column("rollouts", sa.Column("parent_rollout_id", sa.String(32), nullable=True))
    op.add_column("rollouts", sa.Column("branch_turn", sa.Integer, nullable=True))
    op.create_index("ix_rollouts_parent", "rollouts", ["parent_rollout_id"])


def downgrade() -> None:
    op.drop_index("ix_rollouts_parent", table_name="rollouts")
    op.drop_column("rollouts", "branch_turn")
    op.drop_column("rollouts", "parent_rollout_id")
