"""Initial schema: jobs, rollouts, turns, llm_servers.

Revision ID: 0001
Revises:
Create Date: 2026-11-30 05:25:44.038266
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("agent", sa.String(length=64), nullable=False),
        sa.Column("config", JSON, nullable=False),
        sa.Column("idempotency_key", sa.String(length=256), nullable=True),
        sa.Column("n_instances", sa.Integer(), nullable=False),
        sa.Column("n_samples", sa.Integer(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("finished_count", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("owner", "idempotency_key", name="uq_jobs_idempotency"),
    )
    op.create_table(
        "llm_servers",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("url", sa.String(length=512), nullable=False),
        sa.Column("model", sa.String(length=512), nullable=True),
        sa.Column("weight_version", sa.String(length=128), nullable=True),
        sa.Column("backend", sa.String(length=32), nullable=False),
        sa.Column("healthy", sa.Boolean(), nullable=False),
        sa.Column("in_flight", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("checked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("url"),
    )
    op.create_table(
        "rollouts",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("instance_id", sa.String(length=256), nullable=False),
        sa.Column("instance", JSON, nullable=False),
        sa.Column("sample_index", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=True),
        sa.Column("lease_owner", sa.String(length=200), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("queued_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("sandbox", JSON, nullable=True),
        sa.Column("llm_server", sa.String(length=512), nullable=True),
        sa.Column("state", JSON, nullable=False),
        sa.Column("init_seconds", sa.Float(), nullable=True),
        sa.Column("run_seconds", sa.Float(), nullable=True),
        sa.Column("eval_seconds", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stage_started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reward", sa.Float(), nullable=True),
        sa.Column("metrics", JSON, nullable=False),
        sa.Column("prompt_ids", JSON, nullable=True),
        sa.Column("response_ids", JSON, nullable=True),
        sa.Column("response_logprobs", JSON, nullable=True),
        sa.Column("loss_mask", JSON, nullable=True),
        sa.Column("finish_reason", sa.String(length=64), nullable=True),
        sa.Column("policy_versions", JSON, nullable=True),
        sa.Column("token_exact", sa.Boolean(), nullable=True),
        sa.Column("messages", JSON, nullable=True),
        sa.Column("extra", JSON, nullable=False),
        sa.Column("result_seq", sa.Integer(), nullable=True),
        sa.Column("completes_group", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("rollouts", schema=None) as batch_op:
        batch_op.create_index("ix_rollouts_job_instance", ["job_id", "instance_id"], unique=False)
        batch_op.create_index("ix_rollouts_job_seq", ["job_id", "result_seq"], unique=False)
        batch_op.create_index("ix_rollouts_status", ["status"], unique=False)

    op.create_table(
        "turns",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("rollout_id", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("generated_ids", JSON, nullable=True),
        sa.Column("logprobs", JSON, nullable=True),
        sa.Column("text", sa.Text(), nullable=True),
        sa.Column("tool_calls", JSON, nullable=True),
        sa.Column("observation", sa.Text(), nullable=True),
        sa.Column("observation_ids", JSON, nullable=True),
        sa.Column("finish_reason", sa.String(length=64), nullable=True),
        sa.Column("llm_server", sa.String(length=512), nullable=True),
        sa.Column("weight_version", sa.String(length=128), nullable=True),
        sa.Column("gen_seconds", sa.Float(), nullable=True),
        sa.Column("tool_seconds", sa.Float(), nullable=True),
        sa.Column("extra", JSON, nullable=False),
        sa.ForeignKeyConstraint(["rollout_id"], ["rollouts.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.create_index("ix_turns_rollout", ["rollout_id", "attempt", "index"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.drop_index("ix_turns_rollout")

    op.drop_table("turns")
    with op.batch_alter_table("rollouts", schema=None) as batch_op:
        batch_op.drop_index("ix_rollouts_status")
        batch_op.drop_index("ix_rollouts_job_seq")
        batch_op.drop_index("ix_rollouts_job_instance")

    op.drop_table("rollouts")
    op.drop_table("llm_servers")
    op.drop_table("jobs")
