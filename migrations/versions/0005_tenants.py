"""Tenants: API tokens by owner; LLM servers belong to an owner (unique per owner and url).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# SQLite's unnamed unique(url) gets this name when batch mode reflects the table.
NAMING = {"uq": "uq_%(table_name)s_%(column_0_name)s"}


def _url_unique_name() -> str:
    return "llm_servers_url_key" if op.get_bind().dialect.name == "postgresql" else "uq_llm_servers_url"


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("admin", sa.Boolean(), nullable=False),
        sa.Column("label", sa.String(length=256), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("llm_servers", naming_convention=NAMING) as batch:
        batch.add_column(sa.Column("owner", sa.String(length=128), nullable=False, server_default="default"))
        batch.add_column(sa.Column("credential", sa.String(length=128), nullable=True))
        batch.drop_constraint(_url_unique_name(), type_="unique")
        batch.create_unique_constraint("uq_llm_servers_owner_url", ["owner", "url"])


def downgrade() -> None:
    with op.batch_alter_table("llm_servers", naming_convention=NAMING) as batch:
        batch.drop_constraint("uq_llm_servers_owner_url", type_="unique")
        batch.create_unique_constraint(_url_unique_name(), ["url"])
        batch.drop_column("credential")
        batch.drop_column("owner")
    op.drop_table("api_tokens")
