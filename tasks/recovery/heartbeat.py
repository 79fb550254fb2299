"""One heartbeat thread per worker process, beating for every lease the process holds.

The `Heartbeater` is a part of the worker process (`tasks.worker` makes and starts it with the
pool's other parts, `tasks.process.parts`); its stages reach it through `app.raas_parts`.

A stage registers its lease for as long as it runs; the reaper treats a lease whose beat is
older than `lease_timeout` as a dead worker. Beating from a separate thread keeps a stage that
is blocked in a long tool call or generation alive, while a killed process stops beating.

The beat also reads back which of those rollouts were asked to stop, so a stage learns of a
cancel from memory (`cancel_seen`) within one interval, instead of each rollout polling the
database every second (that was one query per slot per second, more than one per turn).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tasks.writes import lifecycle

log = logging.getLogger(__name__)


class Heartbeater:
    """Keeps the leases of one process fresh in the database."""

    def __init__(self, db_url: str, interval: float, on_tick: Callable[[], None] | None = None) -> None:
        self.db_url = db_url
        self.interval = interval
        self.on_tick = on_tick
        self._leases: set[str] = set()
        self._cancelled: frozenset[str] = frozenset()  # leases whose rollout must stop
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the beating thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="raas-heartbeat", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop beating (the leases then expire unless released)."""
        self._stop.set()

    @contextmanager
    def holding(self, lease: str) -> Iterator[None]:
        """Beat for `lease` while the block runs."""
        with self._lock:
            self._leases.add(lease)
        try:
            yield
        finally:
            with self._lock:
                self._leases.discard(lease)

    def held(self) -> list[str]:
        """The leases this process holds now."""
        with self._lock:
            return sorted(self._leases)

    def beat_once(self) -> None:
        """One round of beats (and the periodic extra work)."""
        with self._lock:
            leases = list(self._leases)
        try:
            self._cancelled = frozenset(lifecycle.beat(self.db_url, leases))
            if self.on_tick is not None:
                self.on_tick()
        except Exception:  # a DB blip must not kill the thread; the next round retries
            log.exception("heartbeat round failed")

    def cancel_seen(self, lease: str) -> bool:
        """True once a beat found the rollout held under `lease` asked to stop."""
        return lease in self._cancelled

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat_once()
