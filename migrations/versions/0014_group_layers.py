"""Group layers (issue 38): the prepared workspace a GRPO group's samples fork on one node,
with the lease of the sample preparing it (`tasks.sandboxing.group_layers`).

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "group_layers",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("instance_id", sa.String(256), nullable=False),
        sa.Column("node", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("path", sa.Text, nullable=True),
        sa.Column("mode", sa.String(16), nullable=True),
        sa.Column("lease_owner", sa.String(128), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("prepared_seconds", sa.Float, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("job_id", "instance_id", "node", name="uq_group_layers_group_node"),
    )


def downgrade() -> None:
    op.drop_table("group_layers")
