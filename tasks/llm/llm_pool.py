"""The pipeline's LLM server pools: load, stickiness and health kept in the database.

Registered servers (`llm_servers` table, written by the trainer through the API) are shared by
every RUN worker on every node: a slot is taken by one UPDATE ... RETURNING that picks the
least-loaded row and increments its `in_flight` in the same statement. On PostgreSQL the pick
locks the owner's candidate rows (in id order, so acquirers queue instead of deadlocking) and
orders the locked, current rows by load: concurrent acquirers are serialised per owner, each
sees the counts the previous one committed, and none fails for losing a race (a
compare-and-set with retries gave 64 concurrent acquirers false "no server" errors). SQLite
serialises writers anyway (BEGIN IMMEDIATE). Servers named by a job itself are not rows; their
load is counted from the rollouts that stick to them (`Rollout.llm_server` of rollouts in RUN)
and their health is kept per process.

Stickiness writes the url to `Rollout.llm_server`, fenced on the stage's lease like every
other rollout write, so a RUN resumed in the same attempt returns to it (a retried attempt
starts with none, `lifecycle.retry`: its failure may have been that server) and a worker that
lost its rollout writes nothing. A failing server is marked down and re-probed after `RECHECK_SECONDS`. Weight
updates do not remove servers: the trainer pauses a server (`paused`: new generations wait,
in-flight ones finish), loads the weights, and sets the new `weight_version` while resuming;
the session reads its server's row every turn in the statement that marks the rollout as
generating (`begin_generation`: one round trip), so each turn records the weight version it
was really sampled with.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from sqlalchemy import Row, func, select, update

from agents.llm.pool import (
    RECHECK_SECONDS,
    ServerInfo,
    ServerPool,
    ServersPaused,
    StaticServerPool,
    probe,
)
from agents.llm.backends.guard import url_guard
from agents.llm.spec import LLMSpec, ServerSpec, parse_model
from core.db import get_engine, session_scope
from core.owners import url_rules_for
from core.settings import Settings
from core.errors import LeaseLost, ServiceUnavailable
from core.models import LLMServer, Rollout, Status, utcnow
from core.policy import DEFAULT_OWNER
from tasks.llm import llm_pool_sql as sql
from tasks.writes import turn_log

# A claim finds nothing only when no row qualifies; if one qualifies again right after (a
# server resumed or came back meanwhile), claim again, this many times at most.
CLAIM_ATTEMPTS = 3
# What a claim returns: everything a session needs (ServerInfo), read in the same statement.
RECHECK_SCAN_SECONDS = 1.0  # how often a process looks for down servers to probe, at most


class PoolMemory:
    """What a worker process's rollout pools share (a part of the worker, `tasks.worker`): when
    it last looked for down servers to probe, per owner, and its turn counter for
    `round_robin` routing (like a client-side load balancer: each worker process cycles through
    the servers on its own)."""

    def __init__(self) -> None:
        self.last_recheck: dict[tuple[str, str], float] = {}  # (db url, owner) -> when it looked
        self.round_robin = itertools.count()


class RolloutStickiness:
    """`stick` / `sticky_url` on the rollout's row; the write is fenced on the stage's lease.

    Only the lease holder writes the row's server, so once it is known under this lease (the
    claim's row, `make_pool(claimed=...)`, or this pool's own `stick`) it is not read again:
    the read was one statement per rollout of RUN's hot path."""

    db_url: str
    rollout_id: str
    lease: str
    _known: tuple[str | None] | None = None  # (url,) once known under this lease

    def stick(self, url: str) -> None:
        """Record the rollout's server; LeaseLost if this worker no longer owns the rollout."""
        params = {"p_rollout": self.rollout_id, "p_lease": self.lease, "p_url": url}
        if sql.run_alone(self.db_url, sql.STICK, params) is None:
            raise LeaseLost(f"rollout {self.rollout_id}: lease {self.lease} lost")
        self._known = (url,)

    def knows(self, url: str | None) -> None:
        """The rollout's server as read under this lease (the claim's row): `sticky_url`
        answers it without a read."""
        self._known = (url,)

    def sticky_url(self) -> str | None:
        """The server a previous turn or attempt of this rollout used."""
        if self._known is not None:
            return self._known[0]
        row = sql.run_alone(self.db_url, sql.STICKY_URL, {"p_rollout": self.rollout_id})
        return row[0] if row is not None else None


class RegisteredPool(RolloutStickiness, ServerPool):
    """One owner's servers in the `llm_servers` table, shared by all workers on all nodes.

    `routing` is the operator's `llm_routing` (`ServerPool.routing`); `round_robin` cycles
    through the usable servers in url order with the process's counter (`memory`, the
    worker's `PoolMemory`; a pool of its own without). `writes`: the worker's turn log, which
    carries the generation marks' clears (without one, a clear is written at once).
    """

    def __init__(
        self,
        db_url: str,
        backend: str,
        rollout_id: str,
        lease: str,
        owner: str = DEFAULT_OWNER,
        routing: str = "sticky",
        writes: turn_log.TurnLog | None = None,
        memory: PoolMemory | None = None,
    ) -> None:
        super().__init__(backend, rollout_id)
        self.db_url, self.lease, self.owner, self.routing = db_url, lease, owner, routing
        self.writes = writes
        self.memory = memory if memory is not None else PoolMemory()

    def _info(self, row: LLMServer | Row[Any]) -> ServerInfo:
        return ServerInfo(
            row.url,
            row.model,
            row.weight_version,
            row.backend or self.backend,
            bool(row.paused),
            row.logprobs_mode,
            row.credential,
        )

    def _mine(self, *conditions: Any) -> Any:
        """`select(LLMServer)` of this owner's rows."""
        return select(LLMServer).where(LLMServer.owner == self.owner, *conditions)

    def _update(self, url: str, *conditions: Any) -> Any:
        """`update(LLMServer)` of this owner's row for `url`."""
        return update(LLMServer).where(LLMServer.owner == self.owner, LLMServer.url == url, *conditions)

    def _recheck_down(self) -> None:
        """Probe servers marked down long enough ago; bring back the ones that answer.

        Looked for at most every `RECHECK_SCAN_SECONDS` per process and owner (a down server
        waits `RECHECK_SECONDS` for its probe anyway): not one more query per acquisition."""
        key, now = (self.db_url, self.owner), time.monotonic()
        if now - self.memory.last_recheck.get(key, -1e9) < min(RECHECK_SECONDS, RECHECK_SCAN_SECONDS):
            return
        self.memory.last_recheck[key] = now
        stale = time.time() - RECHECK_SECONDS
        with session_scope(self.db_url) as s:
            rows = s.scalars(self._mine(LLMServer.healthy.is_(False))).all()
            urls = [r.url for r in rows if r.checked_at is None or r.checked_at.timestamp() < stale]
        for url in urls:
            error = probe(url)
            with session_scope(self.db_url) as s:
                s.execute(self._update(url).values(healthy=error is None, last_error=error, checked_at=utcnow()))

    def acquire(self, exclude: frozenset[str] = frozenset()) -> ServerInfo:
        """Claim a slot on the least-loaded healthy, unpaused server (one atomic statement).

        ServersPaused when every healthy candidate is paused, ServiceUnavailable when there is
        none: never because other workers were claiming at the same moment.
        """
        self._recheck_down()
        if self.routing == "round_robin":
            info = self._claim_round_robin(exclude)
            if info is not None:
                return info
        for _ in range(CLAIM_ATTEMPTS):
            row = sql.run_alone(self.db_url, *self._claim(exclude))
            if row is not None:
                return self._info(row)
            self._raise_if_none_usable(exclude)
        raise ServiceUnavailable("every usable LLM server changed state while being claimed")

    def _claim(self, exclude: frozenset[str]) -> tuple[Any, dict[str, Any]]:
        """UPDATE ... SET in_flight = in_flight + 1 WHERE id = (least-loaded candidate)
        RETURNING the server's info, as (statement, parameters) (`_claim_statement`)."""
        return sql.claim_statement(tuple(sorted(exclude))), {"p_owner": self.owner}

    def _claim_round_robin(self, exclude: frozenset[str]) -> ServerInfo | None:
        """A slot on the next usable server in this process's cycle (None: none usable; the
        least-loaded claim then says why)."""
        with session_scope(self.db_url) as s:
            urls = sorted(
                u
                for u in s.scalars(
                    select(LLMServer.url).where(
                        LLMServer.owner == self.owner, LLMServer.healthy.is_(True), LLMServer.paused.is_(False)
                    )
                ).all()
                if u not in exclude
            )
        start = next(self.memory.round_robin)
        for k in range(len(urls)):
            info = self.take(urls[(start + k) % len(urls)])
            if info is not None and not info.paused:
                return info
            if info is not None:  # paused since the read: give the slot back, try the next
                self.release(info.url)
        return None

    def _raise_if_none_usable(self, exclude: frozenset[str]) -> None:
        """After an empty claim: ServersPaused / ServiceUnavailable if that is really so."""
        with session_scope(self.db_url) as s:
            paused = [
                p
                for url, p in s.execute(
                    select(LLMServer.url, LLMServer.paused).where(
                        LLMServer.owner == self.owner, LLMServer.healthy.is_(True)
                    )
                ).all()
                if url not in exclude
            ]
        if not paused:
            raise ServiceUnavailable(
                "no healthy LLM server is registered" + (f" (besides {sorted(exclude)})" if exclude else "")
            )
        if all(paused):
            raise ServersPaused("every healthy LLM server is paused")

    def take(self, url: str) -> ServerInfo | None:
        """Claim a slot on `url` if it is still registered and healthy (one statement)."""
        row = sql.run_alone(self.db_url, sql.TAKE, {"p_owner": self.owner, "p_url": url})
        return self._info(row) if row is not None else None

    def release(self, url: str) -> None:
        """Decrement `in_flight`, never below zero."""
        sql.run_alone(self.db_url, sql.RELEASE, {"p_owner": self.owner, "p_url": url})

    def mark_down(self, url: str, error: str) -> None:
        """healthy=false with the error, visible to every worker and to GET /v1/llm-servers."""
        with session_scope(self.db_url) as s:
            s.execute(self._update(url).values(healthy=False, last_error=error[:2000], checked_at=utcnow()))

    def lookup(self, url: str) -> ServerInfo | None:
        """The row's current model and weight version (read every turn: one round trip)."""
        row = sql.run_alone(self.db_url, sql.LOOKUP, {"p_owner": self.owner, "p_url": url})
        return self._info(row) if row is not None else None

    def candidate_urls(self) -> list[str]:
        """Every server of this owner, healthy first."""
        return registered_urls(self.db_url, self.owner)

    def begin_generation(self, url: str) -> ServerInfo | None:
        """Mark the rollout as generating on `url` and read the server's row, in one statement
        (`_mark_and_read`); a paused or vanished server is not marked. The weight version a
        turn records comes from this read: no other read of the row per turn.

        A clear of the previous mark still queued in the turn writer is taken back (this
        statement writes the column either way; put back if the statement fails) and one
        already being written commits first, so no clear can wipe this mark.
        """
        writes = self.writes
        dropped = writes.drop_queued_clears(self.rollout_id) if writes is not None else 0
        if writes is not None:
            writes.wait_cleared(self.rollout_id)
        try:
            row = sql.run_alone(self.db_url, *self._mark_and_read(url))
        except BaseException:
            if dropped:
                writes.clear_generating(self.rollout_id, self.lease)
            raise
        if row is None:
            raise LeaseLost(f"rollout {self.rollout_id}: lease {self.lease} lost")
        return self._info(row) if row.url is not None else None

    def _mark_and_read(self, url: str) -> tuple[Any, dict[str, Any]]:
        """UPDATE rollouts SET generating_on = (url unless the server is paused or gone)
        WHERE id = :rollout AND lease_owner = :lease RETURNING the server's row, read in the
        same statement under FOR SHARE; as (statement, parameters), the statement built once
        per process (`_mark_and_read_statement`: a turn's statement is then a cache hit, not a
        new tree to build and hash).

        The pause guarantee (`tasks.llm.pool_pause`): `set_paused` UPDATEs the server row, which
        conflicts with this share lock. If the pause committed first, the lock waits for it
        and reads the row as updated (PostgreSQL re-reads a locked row's newest version):
        paused, so no mark. If this statement locked first, the pause waits until the mark
        has committed and then sees it when it counts generations. SQLite runs the statement
        under its database write lock, which orders it with the pause the same way.
        """
        params = {"p_owner": self.owner, "p_url": url, "p_rollout": self.rollout_id, "p_lease": self.lease}
        return sql.mark_and_read_statement(), params

    def end_generation(self) -> None:
        """Clear the rollout's generation mark: queued in the turn writer, committed with the
        next batch (before the turn's record and the next mark). A late clear only makes a
        pause wait a few milliseconds longer; a lost lease has nothing to clear. (A pool without
        the worker's turn log writes it at once.)"""
        if self.writes is not None:
            self.writes.clear_generating(self.rollout_id, self.lease)
            return
        with get_engine(self.db_url).begin() as conn:
            turn_log.clear_generating(conn, self.rollout_id, self.lease)

    def note_paused(self, seconds: float) -> None:
        """Add to the stage's `paused_seconds` (the reaper extends the deadline by it)."""
        sql.run_alone(
            self.db_url, sql.ADD_PAUSED, {"p_rollout": self.rollout_id, "p_lease": self.lease, "p_seconds": seconds}
        )


class JobServerPool(RolloutStickiness, StaticServerPool):
    """Servers named in the job's spec; load = rollouts in RUN that stick to each of them."""

    def __init__(
        self,
        db_url: str,
        backend: str,
        rollout_id: str,
        lease: str,
        servers: list[ServerSpec],
        credential: str | None = None,
    ) -> None:
        super().__init__(backend, rollout_id, servers, credential)
        self.db_url, self.lease = db_url, lease

    def load(self) -> dict[str, int]:
        """This process's slots, or the rollouts in RUN on each server when that is more."""
        with session_scope(self.db_url) as s:
            rows = s.execute(
                select(Rollout.llm_server, func.count())
                .where(Rollout.status == Status.RUN.value, Rollout.llm_server.in_(list(self.servers)))
                .group_by(Rollout.llm_server)
            ).all()
        counts = super().load()
        for url, n in rows:
            counts[url] = max(counts.get(url, 0), n)
        return counts


def make_pool(
    spec: LLMSpec | dict[str, Any],
    db_url: str,
    rollout_id: str,
    lease: str,
    owner: str = DEFAULT_OWNER,
    routing: str = "sticky",
    claimed: Any = None,
    writes: turn_log.TurnLog | None = None,
    memory: PoolMemory | None = None,
) -> ServerPool:
    """The pool of one leased rollout: the job's own servers when it names some (always
    sticky), else the job owner's registered pool routed by `routing` (`llm_routing`).

    `spec` is the job config's typed llm spec (plain JSON from a script or test is validated);
    `claimed`, the rollout's row as the stage's claim returned it under `lease` (its
    `llm_server` is then the sticky server, not read again); `writes`, `memory`: the worker's
    parts a registered pool uses (`RegisteredPool`)."""
    if not isinstance(spec, LLMSpec):
        spec = parse_model(LLMSpec, spec, "llm")
    if spec.servers:
        pool: JobServerPool | RegisteredPool = JobServerPool(
            db_url, spec.backend, rollout_id, lease, spec.servers, spec.credential
        )
    else:
        pool = RegisteredPool(db_url, spec.backend, rollout_id, lease, owner, routing, writes, memory)
    if claimed is not None:
        pool.knows(claimed.llm_server)
    return pool


def registered_urls(db_url: str, owner: str = DEFAULT_OWNER) -> list[str]:
    """`owner`'s registered server urls, healthy first (tokenizer and model discovery)."""
    with session_scope(db_url) as s:
        rows = s.scalars(select(LLMServer).where(LLMServer.owner == owner).order_by(LLMServer.healthy.desc())).all()
        return [r.url for r in rows]


def reconcile_in_flight(db_url: str) -> None:
    """Reset every `in_flight` to the rollouts in RUN that stick to it (repairs lost workers)."""
    with session_scope(db_url) as s:
        counts = dict(
            s.execute(
                select(Rollout.llm_server, func.count())
                .where(Rollout.status == Status.RUN.value)
                .group_by(Rollout.llm_server)
            ).all()
        )
        for row in s.scalars(select(LLMServer)).all():
            row.in_flight = counts.get(row.url, 0)


def check_health(db_url: str, settings: Settings | None = None) -> dict[str, str | None]:
    """Probe every registered server and record the result; {url: error or None}. With
    `settings`, a tenant's server is probed only where the operator's URL rules allow."""
    with session_scope(db_url) as s:
        rows = list(s.execute(select(LLMServer.url, LLMServer.owner)).all())
    results = {}
    for url, owner in rows:  # a tenant's URL only where the operator's rules allow
        with url_guard(url_rules_for(settings, owner) if settings else None):
            results[url] = probe(url)
    with session_scope(db_url) as s:
        for url, error in results.items():
            s.execute(
                update(LLMServer)
                .where(LLMServer.url == url)
                .values(healthy=error is None, last_error=error, checked_at=utcnow())
            )
    return results
