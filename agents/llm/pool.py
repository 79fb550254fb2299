"""The server pool a session draws from: the interface, and an in-memory pool of named servers.

A session asks its pool for a server (fewest in-flight rollouts wins), keeps a rollout on the
server it started on (stickiness: prefix-cache reuse, and a RUN resumed in the same attempt
returns to it; a retried attempt picks again, since its failure may have been that server),
gives the slot back, and marks a failing server down until a probe finds it healthy again.
Where that bookkeeping lives is the pool's business: the pipeline's pools keep it in the
database, fenced on the rollout's lease (`tasks.llm.llm_pool`); `StaticServerPool` keeps it in this
process, for servers a job names when no database is involved (tests, library use).
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from agents.llm.backends.http_client import shared_client
from core.errors import ServiceUnavailable

log = logging.getLogger(__name__)

RECHECK_SECONDS = 10.0
PROBE_TIMEOUT = 2.0


@dataclass(frozen=True)
class ServerInfo:
    """What a session needs to talk to one server."""

    url: str
    model: str | None
    weight_version: str | None
    backend: str
    paused: bool = False  # the trainer is loading weights: wait, do not fail
    logprobs_mode: str | None = "raw_logprobs"  # the server's --logprobs-mode
    credential: str | None = None  # an operator-registered credential's name (policy.llm)


def probe(url: str) -> str | None:
    """None if GET /health answers 2xx, else the reason."""
    try:
        response = shared_client().get(f"{url}/health", timeout=PROBE_TIMEOUT)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if response.is_success else f"health: HTTP {response.status_code}"


class ServersPaused(ServiceUnavailable):
    """Every usable server is paused (weights loading): wait for a resume, do not give up."""


class ServerPool(ABC):
    """One rollout's view of the servers: pick, stick, release, mark down, look up.

    `routing` is `sticky` (the session keeps its server for every turn: its prefix cache stays
    warm) or a per-turn policy (`least_loaded`, `round_robin`): the session then gives its slot
    back after each turn and acquires again for the next, and never sticks.
    """

    routing: str = "sticky"

    def __init__(self, backend: str, rollout_id: str) -> None:
        self.backend = backend
        self.rollout_id = rollout_id

    @property
    def sticky(self) -> bool:
        """True when a rollout keeps one server for all its turns."""
        return self.routing == "sticky"

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
        """The server's current info (weight version, paused), or None if it left the pool."""

    @abstractmethod
    def stick(self, url: str) -> None:
        """Remember that this rollout uses `url` (a resumed RUN of the attempt returns to it)."""

    @abstractmethod
    def sticky_url(self) -> str | None:
        """The server a previous turn or attempt of this rollout used."""

    @abstractmethod
    def candidate_urls(self) -> list[str]:
        """Every server url this pool could hand out (tokenizer and model discovery)."""

    def begin_generation(self, url: str) -> ServerInfo | None:
        """Mark this rollout as generating on `url`, then read the server's current info.

        A pool-wide pause (`tasks.llm.pool_pause`) sets `paused` and then waits for these marks.
        Mark first, read second: a pause committed before the read is seen here (the caller
        drops the mark and waits), one committed after it sees the mark and waits for the
        request. Pools that cannot be paused just look the server up.
        """
        return self.lookup(url)

    def end_generation(self) -> None:
        """Drop the mark `begin_generation` set (the request returned, failed or was not sent)."""

    def note_paused(self, seconds: float) -> None:
        """Add `seconds` this rollout waited on a paused pool (not charged to its deadline)."""


def candidate_urls(spec: Any, registered: Callable[[], list[str]] = list) -> list[str]:
    """Server urls a job could use: the ones it names, else `registered()` (healthy first)."""
    if spec.servers:
        return [s.url for s in spec.servers]
    return list(registered())


# Health of job-named servers, per process: {url: (down_since_monotonic, error)}.
_static_down: dict[str, tuple[float, str]] = {}
_static_lock = threading.Lock()


class StaticServerPool(ServerPool):
    """Servers named in the job's spec; load, stickiness and health are kept in this process."""

    def __init__(self, backend: str, rollout_id: str, servers: list[Any], credential: str | None = None) -> None:
        # `servers`: the job's `agents.llm.spec.ServerSpec`s (not imported: spec imports this module)
        super().__init__(backend, rollout_id)
        self.servers = {
            s.url: ServerInfo(
                s.url,
                s.model,
                s.weight_version,
                s.backend or backend,
                False,
                s.logprobs_mode or "raw_logprobs",
                s.credential or credential,
            )
            for s in servers
        }
        self._local: dict[str, int] = {url: 0 for url in self.servers}
        self._stuck: str | None = None

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

    def load(self) -> dict[str, int]:
        """In-flight rollouts per server, as far as this pool can see (this process)."""
        return dict(self._local)

    def acquire(self, exclude: frozenset[str] = frozenset()) -> ServerInfo:
        """The least-loaded healthy job server (ties go to the order in the spec)."""
        order = {url: i for i, url in enumerate(self.servers)}
        load = self.load()
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

    def stick(self, url: str) -> None:
        """Remember the server for this pool's rollout (in memory)."""
        self._stuck = url

    def sticky_url(self) -> str | None:
        """The server this pool's rollout used last."""
        return self._stuck

    def candidate_urls(self) -> list[str]:
        """The job's servers, in the spec's order."""
        return list(self.servers)
