"""The server pool: fewest in-flight rollouts wins, a rollout sticks to its server, failover.

Registered servers (`llm_servers` table, written by the trainer through the API) are shared by
every RUN worker on every node: a slot is taken with an atomic conditional UPDATE of
`in_flight`, so two workers never both see the same count and pick the same server. Servers
named by a job itself are not rows; their load is counted from the rollouts that stick to them
(`Rollout.llm_server` of rollouts in RUN) and their health is kept per process.

Stickiness keeps a rollout's turns on one server for prefix-cache reuse; the url is written to
`Rollout.llm_server` so a retried attempt returns to it. A failing server is marked down and
re-probed after `RECHECK_SECONDS`. Weight updates do not remove servers: the trainer pauses a
server (`paused`: new generations wait, in-flight ones finish), loads the weights, and sets the
new `weight_version` while resuming; the session re-reads its server's row every turn, so each
turn records the weight version it was really sampled with.
"""
from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy import func, select, update

from core.db import session_scope
from core.errors import ServiceUnavailable
from core.models import LLMServer, Rollout, Status, utcnow

log = logging.getLogger(__name__)

RECHECK_SECONDS = 10.0
PROBE_TIMEOUT = 2.0
CLAIM_RETRIES = 8


@dataclass(frozen=True)
class ServerInfo:
    """What a session needs to talk to one server."""

    url: str
    model: str | None
    weight_version: str | None
    backend: str
    paused: bool = False  # the trainer is loading weights: wait, do not fail
    logprobs_mode: str | None = "raw_logprobs"  # the server's --logprobs-mode


def probe(url: str) -> str | None:
    """None if GET /health answers 2xx, else the reason."""
    try:
        response = httpx.get(f"{url}/health", timeout=PROBE_TIMEOUT)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if response.is_success else f"health: HTTP {response.status_code}"


class ServerPool(ABC):
    """Where a session's servers come from and where their load and health are kept."""

    def __init__(self, db_url: str, backend: str) -> None:
        self.db_url = db_url
        self.backend = backend

    @abstractmethod
    def acquire(self, exclude: frozenset[str] = frozenset()) -> ServerInfo:
        """Take a slot on the healthy server with the fewest in-flight rollouts."""

    @abstractmethod
    def take(self, url: str) -> ServerInfo | None:
        """Take a slot on this known, healthy server (stickiness); None if unusable."""

    @abstractmethod
    def release(self, url: str) -> None:
        """Give back the slot taken on `url`."""

    @abstractmethod
    def mark_down(self, url: str, error: str) -> None:
        """Record that `url` failed; it is not picked until a probe finds it healthy again."""

    @abstractmethod
    def lookup(self, url: str) -> ServerInfo | None:
        """The server's current info (weight version), or None if it left the pool."""

    def stick(self, rollout_id: str, url: str) -> None:
        """Remember the rollout's server on its row (a missing row is fine: nothing to do)."""
        with session_scope(self.db_url) as s:
            s.execute(update(Rollout).where(Rollout.id == rollout_id).values(llm_server=url))

    def sticky_url(self, rollout_id: str) -> str | None:
        """The server a previous turn or attempt of this rollout used."""
        with session_scope(self.db_url) as s:
            return s.scalar(select(Rollout.llm_server).where(Rollout.id == rollout_id))


class ServersPaused(ServiceUnavailable):
    """Every usable server is paused (weights loading): wait for a resume, do not give up."""


class RegisteredPool(ServerPool):
    """The trainer's servers in the `llm_servers` table, shared by all workers on all nodes."""

    def _info(self, row: LLMServer) -> ServerInfo:
        return ServerInfo(row.url, row.model, row.weight_version, row.backend or self.backend,
                          bool(row.paused), row.logprobs_mode)

    def _recheck_down(self) -> None:
        """Probe servers marked down long enough ago; bring back the ones that answer."""
        stale = time.time() - RECHECK_SECONDS
        with session_scope(self.db_url) as s:
            rows = s.scalars(select(LLMServer).where(LLMServer.healthy.is_(False))).all()
            urls = [r.url for r in rows if r.checked_at is None or r.checked_at.timestamp() < stale]
        for url in urls:
            error = probe(url)
            with session_scope(self.db_url) as s:
                s.execute(update(LLMServer).where(LLMServer.url == url).values(
                    healthy=error is None, last_error=error, checked_at=utcnow()))

    def acquire(self, exclude: frozenset[str] = frozenset()) -> ServerInfo:
        """Claim the least-loaded healthy row with a conditional UPDATE (retry on a race)."""
        self._recheck_down()
        for _ in range(CLAIM_RETRIES):
            with session_scope(self.db_url) as s:
                query = select(LLMServer).where(LLMServer.healthy.is_(True))
                healthy = [r for r in s.scalars(query).all() if r.url not in exclude]
                rows = [r for r in healthy if not r.paused]
                if healthy and not rows:
                    raise ServersPaused("every healthy LLM server is paused")
                if not rows:
                    break
                row = min(rows, key=lambda r: (r.in_flight, r.created_at, r.url))
                claimed = s.execute(update(LLMServer).where(
                    LLMServer.id == row.id, LLMServer.in_flight == row.in_flight,
                    LLMServer.healthy.is_(True), LLMServer.paused.is_(False))
                    .values(in_flight=LLMServer.in_flight + 1))
                if claimed.rowcount == 1:
                    return self._info(row)
        raise ServiceUnavailable("no healthy LLM server is registered"
                                 + (f" (besides {sorted(exclude)})" if exclude else ""))

    def take(self, url: str) -> ServerInfo | None:
        """Claim a slot on `url` if it is still registered and healthy."""
        with session_scope(self.db_url) as s:
            row = s.scalar(select(LLMServer).where(LLMServer.url == url))
            if row is None or not row.healthy:
                return None
            s.execute(update(LLMServer).where(LLMServer.id == row.id)
                      .values(in_flight=LLMServer.in_flight + 1))
            return self._info(row)

    def release(self, url: str) -> None:
        """Decrement `in_flight`, never below zero."""
        with session_scope(self.db_url) as s:
            s.execute(update(LLMServer).where(LLMServer.url == url, LLMServer.in_flight > 0)
                      .values(in_flight=LLMServer.in_flight - 1))

    def mark_down(self, url: str, error: str) -> None:
        """healthy=false with the error, visible to every worker and to GET /v1/llm-servers."""
        with session_scope(self.db_url) as s:
            s.execute(update(LLMServer).where(LLMServer.url == url).values(
                healthy=False, last_error=error[:2000], checked_at=utcnow()))

    def lookup(self, url: str) -> ServerInfo | None:
        """The row's current model and weight version."""
        with session_scope(self.db_url) as s:
            row = s.scalar(select(LLMServer).where(LLMServer.url == url))
            return self._info(row) if row is not None else None


# Health of job-named servers, per process: {url: (down_since_monotonic, error)}.
_static_down: dict[str, tuple[float, str]] = {}
_static_lock = threading.Lock()


class JobServerPool(ServerPool):
    """Servers named in the job's spec; load = rollouts in RUN that stick to each of them."""

    def __init__(self, db_url: str, backend: str, servers: list[dict[str, Any]]) -> None:
        super().__init__(db_url, backend)
        self.servers = {s["url"]: ServerInfo(s["url"], s.get("model"), s.get("weight_version"),
                                             s.get("backend") or backend, False,
                                             s.get("logprobs_mode") or "raw_logprobs")
                        for s in servers}
        self._local: dict[str, int] = {url: 0 for url in self.servers}

    def _healthy(self, url: str) -> bool:
        with _static_lock:
            down = _static_down.get(url)
        if down is None:
            return True
        if time.monotonic() - down[0] < RECHECK_SECONDS or probe(url) is not None:
            return False
        with _static_lock:
            _static_down.pop(url, None)
        return True

    def _load(self) -> dict[str, int]:
        with session_scope(self.db_url) as s:
            rows = s.execute(select(Rollout.llm_server, func.count()).where(
                Rollout.status == Status.RUN.value, Rollout.llm_server.in_(list(self.servers)))
                .group_by(Rollout.llm_server)).all()
        counts = dict(self._local)
        for url, n in rows:
            counts[url] = max(counts.get(url, 0), n)
        return counts

    def acquire(self, exclude: frozenset[str] = frozenset()) -> ServerInfo:
        """The least-loaded healthy job server (ties go to the order in the spec)."""
        order = {url: i for i, url in enumerate(self.servers)}
        load = self._load()
        for url in sorted(self.servers, key=lambda u: (load.get(u, 0), order[u])):
            if url not in exclude and self._healthy(url):
                self._local[url] += 1
                return self.servers[url]
        raise ServiceUnavailable("no healthy LLM server among the job's servers")

    def take(self, url: str) -> ServerInfo | None:
        """The job server `url` if it is one of this job's and healthy."""
        if url not in self.servers or not self._healthy(url):
            return None
        self._local[url] += 1
        return self.servers[url]

    def release(self, url: str) -> None:
        """Forget this process's slot on `url`."""
        if self._local.get(url, 0) > 0:
            self._local[url] -= 1

    def mark_down(self, url: str, error: str) -> None:
        """Down for this process until a probe after RECHECK_SECONDS succeeds."""
        log.warning("LLM server %s marked down: %s", url, error)
        with _static_lock:
            _static_down[url] = (time.monotonic(), error)

    def lookup(self, url: str) -> ServerInfo | None:
        """The job's info for `url` (weight version as named in the spec)."""
        return self.servers.get(url)


def make_pool(spec: dict[str, Any], db_url: str) -> ServerPool:
    """The job's own servers when it names some, else the registered pool."""
    if spec.get("servers"):
        return JobServerPool(db_url, spec.get("backend", "vllm"), spec["servers"])
    return RegisteredPool(db_url, spec.get("backend", "vllm"))


def candidate_urls(spec: Any, db_url: str) -> list[str]:
    """Server urls a job could use, healthy first (for tokenizer and model discovery)."""
    if spec.servers:
        return [s.url for s in spec.servers]
    with session_scope(db_url) as s:
        rows = s.scalars(select(LLMServer).order_by(LLMServer.healthy.desc())).all()
        return [r.url for r in rows]


def reconcile_in_flight(db_url: str) -> None:
    """Reset every `in_flight` to the rollouts in RUN that stick to it (repairs lost workers)."""
    with session_scope(db_url) as s:
        counts = dict(s.execute(select(Rollout.llm_server, func.count()).where(
            Rollout.status == Status.RUN.value).group_by(Rollout.llm_server)).all())
        for row in s.scalars(select(LLMServer)).all():
            row.in_flight = counts.get(row.url, 0)


def check_health(db_url: str) -> dict[str, str | None]:
    """Probe every registered server and record the result; {url: error or None}."""
    with session_scope(db_url) as s:
        urls = list(s.scalars(select(LLMServer.url)).all())
    results = {url: probe(url) for url in urls}
    with session_scope(db_url) as s:
        for url, error in results.items():
            s.execute(update(LLMServer).where(LLMServer.url == url).values(
                healthy=error is None, last_error=error, checked_at=utcnow()))
    return results
