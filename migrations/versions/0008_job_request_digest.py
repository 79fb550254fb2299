"""Jobs keep a digest of their submission per field, so a replayed idempotency key can tell
the same request (same job, same rollout ids in the same order) from a different one (409).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column("jobs", sa.Column("request_digest", JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:  # SQLite drops columns by copying the table
        batch.drop_column("request_digest")
