"""SQLAlchemy models: the database is the source of truth, never the broker.

`Job` is a batch, `Rollout` one trajectory, `Turn` the append-only per-turn log, `LLMServer`
an inference server registered by the trainer. Rollout status moves only along `TRANSITIONS`;
every stage claims its row with a conditional UPDATE (see `tasks.writes.lifecycle`).
"""

from __future__ import annotations

import enum
import uuid
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

JSONType = JSON().with_variant(JSONB(), "postgresql")


def utcnow() -> datetime:
    """Timezone-aware now; every timestamp in the database is UTC."""
    return datetime.now(timezone.utc)


def new_id() -> str:
    """Opaque 32-hex ids: unguessable, URL-safe, sortable enough for humans."""
    return uuid.uuid4().hex


class Base(DeclarativeBase):
    """Declarative base of all raas tables."""


class Status(str, enum.Enum):
    """Where a rollout is. `init`/`run`/`eval` with no lease mean 'queued for that stage'."""

    PENDING = "pending"
    INIT = "init"
    RUN = "run"
    EVAL = "eval"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Outcome(str, enum.Enum):
    """How a rollout ended; infra failures are never disguised as reward 0."""

    COMPLETED = "completed"
    AGENT_ERROR = "agent_error"
    TIMEOUT = "timeout"
    INFRA_ERROR = "infra_error"
    CANCELLED = "cancelled"
    # The instance's prompt does not fit the effective context: nothing was generated, nothing
    # graded (reward null). A trainer drops it; it is never a reward-0 sample.
    PROMPT_TOO_LONG = "prompt_too_long"


TERMINAL = frozenset({Status.DONE, Status.FAILED, Status.CANCELLED})
TERMINAL_VALUES = sorted(s.value for s in TERMINAL)  # for SQL `IN` clauses
ACTIVE = frozenset({Status.INIT, Status.RUN, Status.EVAL})

# Allowed status moves. Back to PENDING is the reaper's retry of a lost attempt.
TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.PENDING: frozenset({Status.INIT, Status.FAILED, Status.CANCELLED}),
    Status.INIT: frozenset({Status.RUN, Status.PENDING, Status.FAILED, Status.CANCELLED}),
    Status.RUN: frozenset({Status.EVAL, Status.PENDING, Status.FAILED, Status.CANCELLED}),
    Status.EVAL: frozenset({Status.DONE, Status.PENDING, Status.FAILED, Status.CANCELLED}),
    Status.DONE: frozenset(),
    Status.FAILED: frozenset(),
    Status.CANCELLED: frozenset(),
}


def sources_of(target: Status) -> list[str]:
    """The statuses from which `target` may be entered (for conditional UPDATEs)."""
    return [s.value for s, targets in TRANSITIONS.items() if target in targets]


class Job(Base):
    """A batch submitted by a trainer: instances x n_samples rollouts of one agent."""

    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("owner", "idempotency_key", name="uq_jobs_idempotency"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner: Mapped[str] = mapped_column(String(128), default="default")
    agent: Mapped[str] = mapped_column(String(64))
    config: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    idempotency_key: Mapped[str | None] = mapped_column(String(256))
    # Digest of the submission per field (app.idempotency): a replayed key with another body
    # is refused naming the field; NULL for jobs submitted before revision 0008.
    request_digest: Mapped[dict[str, str] | None] = mapped_column(JSONType)
    n_instances: Mapped[int] = mapped_column(Integer, default=0)
    # Rollouts per instance: the group size plus the spares of a straggler cut.
    n_samples: Mapped[int] = mapped_column(Integer, default=1)
    # Usable samples that complete a group when the job cuts stragglers (spare samples or a
    # group deadline, `groups` rows); NULL: a group is all of its n_samples.
    group_size: Mapped[int | None] = mapped_column(Integer)
    # Higher runs first: its stage messages overtake lower ones in every queue.
    priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Called (signed, retried, from the callback dispatcher) when a group or the job completes.
    callback_url: Mapped[str | None] = mapped_column(String(2048))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # Set while the job is paused: INIT claims none of its queued rollouts (`tasks.writes.pauses`);
    # the reason says who paused it (a trainer, or the health alert that did).
    paused_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    pause_reason: Mapped[str | None] = mapped_column(Text)
    # Allocator of the per-job completion order; bumped under the job row lock.
    finished_count: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    rollouts: Mapped[list[Rollout]] = relationship(back_populates="job", lazy="raise")

    @property
    def n_rollouts(self) -> int:
        """Total rollouts of the job."""
        return self.n_instances * self.n_samples


class Rollout(Base):
    """One trajectory of one sample of one instance, with its lease and its token arrays."""

    __tablename__ = "rollouts"
    __table_args__ = (
        Index("ix_rollouts_job_seq", "job_id", "result_seq"),
        Index("ix_rollouts_status", "status"),
        Index("ix_rollouts_job_instance", "job_id", "instance_id"),
        Index("ix_rollouts_parent", "parent_rollout_id"),
        # only the few rows waiting for publication are indexed
        Index(
            "ix_rollouts_outbox",
            "outbox_at",
            postgresql_where=text("outbox_at IS NOT NULL"),
            sqlite_where=text("outbox_at IS NOT NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    instance_id: Mapped[str] = mapped_column(String(256))
    instance: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    sample_index: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(16), default=Status.PENDING.value)
    outcome: Mapped[str | None] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)  # the current attempt's (None once done)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    # Earlier attempts and why each ended: [{"attempt", "error", "ended_at"}].
    attempt_history: Mapped[list[dict[str, Any]]] = mapped_column(JSONType, default=list)
    # RUNs of an attempt that were lost and continued in the same sandbox from the stored
    # turns: [{"attempt", "from_turn", "error", "at"}] (see `tasks.recovery.resume`).
    resumes: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONType)
    node: Mapped[str | None] = mapped_column(String(128))
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    queued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # The outbox: set when the INIT message is still to be published (see tasks.broker.outbox).
    outbox_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    sandbox: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    llm_server: Mapped[str | None] = mapped_column(String(512))
    # The server a request of this rollout is on right now (set before it is sent, cleared
    # when it returns): what a pool-wide pause waits for (`tasks.llm.pool_pause`).
    generating_on: Mapped[str | None] = mapped_column(String(512), index=True)
    # Seconds the current stage waited on a paused pool: not charged to its deadline.
    paused_seconds: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    state: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    init_seconds: Mapped[float | None] = mapped_column(Float)
    run_seconds: Mapped[float | None] = mapped_column(Float)
    eval_seconds: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    stage_started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    reward: Mapped[float | None] = mapped_column(Float)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    prompt_ids: Mapped[list[int] | None] = mapped_column(JSONType)
    response_ids: Mapped[list[int] | None] = mapped_column(JSONType)
    response_logprobs: Mapped[list[float] | None] = mapped_column(JSONType)
    loss_mask: Mapped[list[int] | None] = mapped_column(JSONType)
    finish_reason: Mapped[str | None] = mapped_column(String(64))
    policy_versions: Mapped[list[Any] | None] = mapped_column(JSONType)
    token_exact: Mapped[bool | None] = mapped_column(Boolean)
    messages: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONType)
    extra: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    # What RUN produced (swe: file changes, code: solution files, math/search: the answer),
    # stored before EVAL grades it; re-evaluation grades the same artifact.
    artifact: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    result_seq: Mapped[int | None] = mapped_column(Integer)
    completes_group: Mapped[bool] = mapped_column(Boolean, default=False)
    # Why a straggler cut took this sample out of its group (its group completed without it);
    # a cut sample is never one of a group's members, whatever it ends with.
    cut_reason: Mapped[str | None] = mapped_column(String(256))
    # A branch (`app.branches`): the rollout it continues and the turn index it continues
    # after. Its turns 0..branch_turn are the parent's, inherited as attempt 0 of its turn log
    # and replayed into its own sandbox before it samples on; NULL for a rollout of its own.
    parent_rollout_id: Mapped[str | None] = mapped_column(String(32))
    branch_turn: Mapped[int | None] = mapped_column(Integer)

    job: Mapped[Job] = relationship(back_populates="rollouts", lazy="raise")


class GroupStatus(str, enum.Enum):
    """Where a cut-enabled group is: open, complete (size usable members) or short."""

    OPEN = "open"
    COMPLETE = "complete"
    SHORT = "short"


class Group(Base):
    """One instance's GRPO group in a job that cuts stragglers (spares or a deadline).

    `members` are the first `size` usable samples (reward not null: infrastructure failures
    never fill a group), in the order they finished; `cut` the samples stopped when the group
    closed. A group closes once: complete when `size` are usable, short (with `reason`) when
    its deadline passed or every sample ended with fewer usable.
    """

    __tablename__ = "groups"
    __table_args__ = (Index("ix_groups_deadline", "status", "deadline_at"),)

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    instance_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    size: Mapped[int] = mapped_column(Integer)
    timeout: Mapped[float | None] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16), default=GroupStatus.OPEN.value)
    members: Mapped[list[str]] = mapped_column(JSONType, default=list)
    cut: Mapped[list[str]] = mapped_column(JSONType, default=list)
    reason: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    deadline_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    closed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The sample that carries `completes_group` (chosen once, when the group is settled).
    closer: Mapped[str | None] = mapped_column(String(32))


class Callback(Base):
    """The callback outbox: one signed POST to a job's `callback_url`, written in the same
    transaction as the completion it announces and delivered by `tasks.writes.callbacks`."""

    __tablename__ = "callbacks"
    __table_args__ = (Index("ix_callbacks_next", "next_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    owner: Mapped[str] = mapped_column(String(128))
    url: Mapped[str] = mapped_column(String(2048))
    event: Mapped[str] = mapped_column(String(16))  # group | job
    payload: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # NULL: settled
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Turn(Base):
    """Append-only log of one agent turn: what resume, replay and debugging read.

    A turn holds everything needed to rebuild the agent loop exactly where it stood after it
    (`tasks.recovery.resume`): the generation verbatim, the messages appended after it with their
    template ids, and the loop's counters. (rollout, attempt, index) is unique, so a turn is
    never logged twice (a retried insert whose first commit landed finds its own row).
    Attempt 0 is a branch's inheritance: its parent's turns 0..k, copied when it was made
    (`app.branches`), replayed by its first RUN.
    """

    __tablename__ = "turns"
    __table_args__ = (Index("uq_turns_rollout_attempt_index", "rollout_id", "attempt", "index", unique=True),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rollout_id: Mapped[str] = mapped_column(ForeignKey("rollouts.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    index: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    generated_ids: Mapped[list[int] | None] = mapped_column(JSONType)
    logprobs: Mapped[list[float] | None] = mapped_column(JSONType)
    text: Mapped[str | None] = mapped_column(Text)
    tool_calls: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONType)
    observation: Mapped[str | None] = mapped_column(Text)
    observation_ids: Mapped[list[int] | None] = mapped_column(JSONType)
    # The messages the loop appended after the generation (tool results, a nudge), as sent to
    # the chat template; `observation` is their text joined, `observation_ids` their tokens.
    observation_messages: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONType)
    # The agent loop's counters after this turn (turn count, tool calls, invalid streak, how
    # the episode ended and its answer): what a resumed RUN continues from.
    loop_state: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    finish_reason: Mapped[str | None] = mapped_column(String(64))
    llm_server: Mapped[str | None] = mapped_column(String(512))
    weight_version: Mapped[str | None] = mapped_column(String(128))
    gen_seconds: Mapped[float | None] = mapped_column(Float)
    tool_seconds: Mapped[float | None] = mapped_column(Float)
    extra: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)


class LLMServer(Base):
    """An inference server registered by a trainer; `in_flight` counts sticky rollouts.

    Servers belong to an owner: a tenant's pool is its own rows (the same url may be
    registered by two tenants, each row counting its own load)."""

    __tablename__ = "llm_servers"
    __table_args__ = (UniqueConstraint("owner", "url", name="uq_llm_servers_owner_url"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner: Mapped[str] = mapped_column(String(128), default="default", server_default="default")
    url: Mapped[str] = mapped_column(String(512))
    credential: Mapped[str | None] = mapped_column(String(128))
    model: Mapped[str | None] = mapped_column(String(512))
    weight_version: Mapped[str | None] = mapped_column(String(128))
    backend: Mapped[str] = mapped_column(String(32), default="vllm")
    healthy: Mapped[bool] = mapped_column(Boolean, default=True)
    # Paused by the trainer while it loads new weights: generations wait, they do not fail.
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    # The server's --logprobs-mode (vLLM): what its logprobs mean; recorded on every turn.
    logprobs_mode: Mapped[str] = mapped_column(String(32), default="raw_logprobs")
    in_flight: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text)
    checked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ServiceFlag(Base):
    """A service-wide switch shared by every gateway process (e.g. ProRL's /start state)."""

    __tablename__ = "service_flags"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    enabled: Mapped[bool] = mapped_column(Boolean, default=False)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


class ApiToken(Base):
    """A tenant's API token, kept as its SHA-256 only (`raas token add/list/rm`)."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 hex of the token
    owner: Mapped[str] = mapped_column(String(128))
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    label: Mapped[str | None] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class UISession(Base):
    """A dashboard login: the cookie holds a random id whose SHA-256 is `id`; the API token it
    logged in with is kept as its SHA-256 only, resolved again on every request (a removed
    token ends its sessions)."""

    __tablename__ = "ui_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_digest: Mapped[str] = mapped_column(String(64))
    csrf: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class Node(Base):
    """A node of the deployment and the last time any of its processes said it was alive.

    Its reaper beats it every pass and its stage workers every few seconds; a node whose row
    went stale for `node_timeout` is dead, and what it held restarts on a live node. Nodes
    without a row (never started a raas process since this table existed) are never judged.
    """

    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    beat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # When its reaper last finished a start-up pass (stale sandboxes stopped).
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class QueueConsumer(Base):
    """One worker process consuming one queue, beaten while the process lives.

    A queue with waiting rollouts and no fresh consumer row is stuck work (its pool died and
    nothing restarted it): the reaper judges queues by these rows as well as by their depth.
    """

    __tablename__ = "queue_consumers"
    __table_args__ = (Index("ix_queue_consumers_queue", "queue"),)

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    node: Mapped[str] = mapped_column(String(128))
    queue: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    beat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Validation(Base):
    """An environment validation run (`raas validate`): gold and null actions graded k times.

    A done run with a `name` is that owner's quarantine list of that name (the newest done run
    of the name wins): a job naming it (`quarantine`) is refused for the listed instances.
    """

    __tablename__ = "validations"
    __table_args__ = (Index("ix_validations_owner_name", "owner", "name"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner: Mapped[str] = mapped_column(String(128), default="default")
    name: Mapped[str | None] = mapped_column(String(128))
    agent: Mapped[str] = mapped_column(String(64))
    k: Mapped[int] = mapped_column(Integer, default=1)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    request: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)  # config + instances
    report: Mapped[list[dict[str, Any]]] = mapped_column(JSONType, default=list)
    quarantined: Mapped[list[str]] = mapped_column(JSONType, default=list)
    error: Mapped[str | None] = mapped_column(Text)
    seconds: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class JobAlert(Base):
    """A health alert of a job (`tasks.watch.health_alerts`): raised once when a figure of its recent
    rollouts crosses the job's threshold, cleared when it is back; the event stream and the
    job's callbacks carry it."""

    __tablename__ = "job_alerts"
    __table_args__ = (Index("ix_job_alerts_job", "job_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(32))
    severity: Mapped[str] = mapped_column(String(16))
    value: Mapped[float] = mapped_column(Float)
    threshold: Mapped[float] = mapped_column(Float)
    seq: Mapped[int] = mapped_column(Integer)  # the job's finished rollouts when raised
    weight_version: Mapped[str | None] = mapped_column(String(256))
    message: Mapped[str] = mapped_column(Text)
    action: Mapped[str] = mapped_column(String(16), default="none")
    raised_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    cleared_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class LayerStatus(str, enum.Enum):
    """A group layer's life: prepared once, used by the group's samples, removed after them."""

    PREPARING = "preparing"  # one sample's INIT (the lease owner) is preparing it
    READY = "ready"  # the samples fork it
    FAILED = "failed"  # its preparation failed: the next sample that wants it tries again
    REMOVED = "removed"  # every sample was past RUN: its folder is gone


class GroupLayer(Base):
    """The prepared workspace a GRPO group's samples fork on one node (`tasks.sandboxing.group_layers`).

    The first sample of an instance to reach INIT on a node prepares it (the lease, beaten
    while it works, so a preparer that died is taken over); the others wait for `ready`, then
    each runs on a copy-on-write layer over `path`. The reaper removes it once no sample of the
    group is queued for or in INIT or RUN.
    """

    __tablename__ = "group_layers"
    __table_args__ = (UniqueConstraint("job_id", "instance_id", "node", name="uq_group_layers_group_node"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: uuid.uuid4().hex)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    instance_id: Mapped[str] = mapped_column(String(256))
    node: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16), default=LayerStatus.PREPARING.value)
    # The lower folder on the node (set when a preparation starts, so a dead one's is known).
    path: Mapped[str | None] = mapped_column(Text)
    mode: Mapped[str | None] = mapped_column(String(16))  # "overlay" or "copy" (`sandbox.overlay`)
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    prepared_seconds: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
