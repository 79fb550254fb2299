"""The reaper: finds work whose worker, node or message is gone and puts it back on track.

Every pass is a handful of conditional UPDATEs, so any number of reapers may run at once
(one per node is the usual deployment). This module is the loop; the rules live beside it:
- `tasks/recovery/reclaim.py` (`ReclaimRules`): lost leases (`reclaim_lost`: resume, regrade, or a
  new attempt) and rollouts abandoned by a dead node or a queue nobody consumes
  (`reroute_abandoned`: hand-back to a live node's EVAL, or a new attempt from INIT);
- `tasks/recovery/sweeps.py` (`Sweeps`): hung stages (`fail_overdue`), the publication outbox
  (`drain_outbox`), queued rollouts whose message may be lost (`republish_stale`), and this
  node's sandboxes and workspaces no live attempt owns (`sweep_sandboxes`);
- here: straggler groups past their deadline (`tasks.writes.groups.close_overdue`), and the LLM
  server pool every `LLM_MAINTENANCE_SECONDS`: health probes (a server marked down comes back
  when it answers) and in-flight counts recomputed from the rollouts in RUN (a killed worker
  never released its slot).

Every rule acts on a row through a conditional UPDATE fenced on what it observed (the lease,
or attempt + status + node of a queued row), so two reapers running the same pass at once
never both retry or re-publish a row. A reaper beats its node's row every pass; its start-up
pass stops the node's stale sandboxes first (a node coming back after it was judged dead
holds sandboxes of attempts that restarted elsewhere). It judges nodes only after watching
the database for `node_timeout` without a gap, and no lease for a lease time after a database
outage (heartbeats could not be written meanwhile).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sqlalchemy import select

from core.db import session_scope
from core.settings import Settings
from tasks.sandboxing import group_layers
from tasks.writes import groups
from tasks.watch import health_alerts
from tasks.recovery import nodes
from tasks.process.parts import ProcessParts, Step
from tasks.writes.callbacks import CallbackDispatcher
from tasks.writes.db_retry import is_disconnect
from tasks.recovery.reclaim import ReclaimRules
from tasks.watch.health import HealthCache
from tasks.recovery.sweeps import Sweeps

log = logging.getLogger(__name__)
LLM_MAINTENANCE_SECONDS = 60.0


class Reaper(ReclaimRules, Sweeps):
    """One reaper loop for `settings` (its rules from `ReclaimRules` and `Sweeps`); `run_once`
    is what tests call."""

    def __init__(self, settings: Settings, celery: Any) -> None:
        self.settings = settings
        self.db = settings.db_url
        self.celery = celery
        self._stop = threading.Event()
        self._llm_checked = 0.0
        self._watching_since: float | None = None  # start of this reaper's unbroken view
        self._last_beat = 0.0
        self._db_lost = False  # the last pass could not reach the database
        self._db_back_at: float | None = None  # monotonic time it answered again
        # The reaper's long-lived parts: the callback dispatcher, beside the passes.
        self.parts = ProcessParts([Step(CallbackDispatcher, lambda parts: CallbackDispatcher(settings))])
        self._health = HealthCache()  # issue 37: each job's finished rollouts, read incrementally

    def start_up(self) -> int:
        """The first pass of a (re)started reaper: stop this node's stale sandboxes, then say
        the node is alive; returns sandboxes stopped."""
        stopped = self.sweep_sandboxes()
        nodes.beat_node(self.db, self.settings.node, started=True)
        if stopped:
            log.warning("node %s start-up: stopped %s stale sandbox(es)", self.settings.node, stopped)
        return stopped

    def run_once(self) -> dict[str, int]:
        """One pass; returns how many rollouts each rule touched."""
        nodes.beat_node(self.db, self.settings.node)
        self._saw_database()
        nodes.prune_consumers(self.db, self.settings.node_timeout)
        return {
            "lost": self.reclaim_lost(),
            "overdue": self.fail_overdue(),
            "abandoned": self.reroute_abandoned() if self._watched_long_enough() else 0,
            "outbox": self.drain_outbox(),
            "requeued": self.republish_stale(),
            "group_deadlines": len(groups.close_overdue(self.db)),
            "sandboxes": self.sweep_sandboxes(),
            "group_layers": group_layers.sweep(self.settings),  # layers no sample can use
            "checkpoints": self.sweep_checkpoints(),  # of rollouts past RUN
            "llm_servers": self.maintain_llm_pool(),
            "health_alerts": health_alerts.check_running(self.db, self._health),
        }

    def _saw_database(self) -> None:
        """Note a successful beat; a gap (the database was away, or this reaper just started)
        restarts the reaper's view of who is alive."""
        now = time.monotonic()
        gap = max(3 * self.settings.reaper_interval, self.settings.node_timeout / 4)
        if self._watching_since is None or now - self._last_beat > gap:
            self._watching_since = now
        self._last_beat = now

    def _watched_long_enough(self) -> bool:
        """Judge nodes only after watching them for `node_timeout` without a gap: after a
        database outage every node's rows are stale, none of them is dead."""
        return (
            self._watching_since is not None and time.monotonic() - self._watching_since >= self.settings.node_timeout
        )

    def maintain_llm_pool(self, force: bool = False) -> int:
        """Probe registered servers and repair in-flight counts; returns servers probed."""
        now = time.monotonic()
        if not force and now - self._llm_checked < LLM_MAINTENANCE_SECONDS:
            return 0
        self._llm_checked = now
        from tasks.llm.llm_pool import check_health, reconcile_in_flight

        reconcile_in_flight(self.db)
        return len(check_health(self.db, self.settings))

    def run_forever(self) -> None:
        """Reap every `reaper_interval` seconds until `stop()` (after the start-up pass).

        The callback dispatcher runs beside it in its own thread: a slow callback endpoint
        never delays a pass."""
        self.parts.start()
        while not self._stop.is_set():
            try:
                self.start_up()
                break
            except Exception:
                log.exception("reaper start-up pass failed")
                self._stop.wait(self.settings.reaper_interval)
        while not self._stop.is_set():
            try:
                if self._db_lost:
                    self._database_is_back()  # raises while it is still down
                counts = self.run_once()
                if any(counts.values()):
                    log.info("reaper pass: %s", counts)
            except Exception as exc:
                self._db_lost = self._db_lost or is_disconnect(exc)
                log.exception("reaper pass failed")
            self._stop.wait(self.settings.reaper_interval)

    def _database_is_back(self) -> None:
        """After passes that could not reach the database: probe it, and once it answers
        start the lease time during which no lease is judged lost (`reclaim_lost`)."""
        with session_scope(self.db) as s:
            s.execute(select(1))
        self._db_lost, self._db_back_at = False, time.monotonic()
        log.warning(
            "reaper: the database answers again; no lease is judged lost for %.0fs (workers could not beat meanwhile)",
            self.settings.lease_timeout,
        )

    def stop(self) -> None:
        """End `run_forever` after the current pass (and the callback dispatcher)."""
        self._stop.set()
        self.parts.stop()
