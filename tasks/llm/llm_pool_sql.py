"""The LLM pool's statements, built once per process and run with parameters.

`tasks.llm.llm_pool` runs one of these per acquisition, release, stickiness write and turn (the
generation mark). Each is a module-level construct with bound parameters (p_owner, p_url,
p_rollout, p_lease) rather than a statement built per call: SQLAlchemy then finds the compiled
form by a key memoized on the object instead of building and hashing a new statement tree each
time, which was most of the CPU of these one-row statements.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Row, bindparam, case, select, update

from core import driver_statements
from core.db import get_engine
from core.models import LLMServer, Rollout

# What a claim returns: everything a session needs (ServerInfo), read in the same statement.
INFO_COLUMNS = (
    LLMServer.url,
    LLMServer.model,
    LLMServer.weight_version,
    LLMServer.backend,
    LLMServer.paused,
    LLMServer.logprobs_mode,
    LLMServer.credential,
)


_THIS_SERVER = (LLMServer.owner == bindparam("p_owner"), LLMServer.url == bindparam("p_url"))
TAKE = (
    update(LLMServer)
    .where(*_THIS_SERVER, LLMServer.healthy.is_(True))
    .values(in_flight=LLMServer.in_flight + 1)
    .returning(*INFO_COLUMNS)
)
RELEASE = update(LLMServer).where(*_THIS_SERVER, LLMServer.in_flight > 0).values(in_flight=LLMServer.in_flight - 1)
STICK = (
    update(Rollout)
    .where(Rollout.id == bindparam("p_rollout"), Rollout.lease_owner == bindparam("p_lease"))
    .values(llm_server=bindparam("p_url"))
    .returning(Rollout.id)
)
LOOKUP = select(*INFO_COLUMNS).where(*_THIS_SERVER)
ADD_PAUSED = (
    update(Rollout)
    .where(Rollout.id == bindparam("p_rollout"), Rollout.lease_owner == bindparam("p_lease"))
    .values(paused_seconds=Rollout.paused_seconds + bindparam("p_seconds", type_=Rollout.paused_seconds.type))
)
STICKY_URL = select(Rollout.llm_server).where(Rollout.id == bindparam("p_rollout"))


@functools.lru_cache(maxsize=64)
def claim_statement(exclude: tuple[str, ...]) -> Any:
    """The least-loaded claim (`RegisteredPool.acquire`) of p_owner's servers but `exclude`.

    The inner SELECT locks every candidate row of the owner (FOR UPDATE, id order: no
    deadlock between acquirers) and returns their current versions, which the outer SELECT
    orders by load: a concurrent acquirer waits for the lock and then sees the count the
    previous one committed, so 64 simultaneous claims spread exactly. SQLite ignores FOR
    UPDATE; its writers are serialised by BEGIN IMMEDIATE.
    """
    usable = (LLMServer.owner == bindparam("p_owner"), LLMServer.healthy.is_(True), LLMServer.paused.is_(False))
    if exclude:
        usable += (LLMServer.url.not_in(list(exclude)),)
    locked = (
        select(LLMServer.id, LLMServer.in_flight, LLMServer.created_at, LLMServer.url)
        .where(*usable)
        .order_by(LLMServer.id)
        .with_for_update()
        .subquery()
    )
    pick = (
        select(locked.c.id).order_by(locked.c.in_flight, locked.c.created_at, locked.c.url).limit(1).scalar_subquery()
    )
    return (
        update(LLMServer)
        .where(LLMServer.id == pick, *usable)
        .values(in_flight=LLMServer.in_flight + 1)
        .returning(*INFO_COLUMNS)
    )


@functools.cache
def mark_and_read_statement() -> Any:
    """The statement of `RegisteredPool._mark_and_read`, with parameters p_owner, p_url,
    p_rollout and p_lease."""
    server = (
        select(*INFO_COLUMNS)
        .where(LLMServer.owner == bindparam("p_owner"), LLMServer.url == bindparam("p_url"))
        .with_for_update(read=True)
        .cte("server")
    )
    paused = select(server.c.paused).scalar_subquery()
    return (
        update(Rollout)
        .where(Rollout.id == bindparam("p_rollout"), Rollout.lease_owner == bindparam("p_lease"))
        .values(generating_on=case((paused.is_(False), bindparam("p_url")), else_=None))
        .returning(*[select(column).scalar_subquery().label(column.name) for column in server.c])
        .add_cte(server)
    )


def run_alone(db_url: str, statement: Any, params: dict[str, Any] | None = None) -> Row[Any] | None:
    """Run one of these statements as its own transaction; its first row, if it returns rows.

    On PostgreSQL on the driver's cursor in autocommit (`core.driver_statements.run_alone`):
    the server commits as the statement ends, so the row locks of a claim are held for the
    statement alone, never while this thread waits for the GIL to send COMMIT (with 64
    sessions in one worker that wait held up every other acquirer), and the call costs one
    round trip and a fraction of SQLAlchemy's CPU. SQLite keeps the usual short transaction
    (BEGIN IMMEDIATE serialises its writers). `statement` is one built once (a module
    constant or a cached builder here): the driver path keeps its compiled form.
    """
    return driver_statements.run_alone(get_engine(db_url), statement, params or {}).first()
