"""Dashboard sessions kept on the server: the cookie carries a random id, never the API token.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ui_sessions",
        sa.Column("id", sa.String(64), primary_key=True),  # sha256 hex of the cookie's id
        sa.Column("token_digest", sa.String(64), nullable=False),  # sha256 of the API token
        sa.Column("csrf", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_ui_sessions_expires_at", "ui_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_ui_sessions_expires_at", table_name="ui_sessions")
    op.drop_table("ui_sessions")
