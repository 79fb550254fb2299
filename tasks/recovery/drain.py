"""A pool's bounded drain on SIGTERM/SIGINT, and INIT's gate on the node's RUN/EVAL pools.

Celery's warm shutdown waits for running tasks without limit, and its cold shutdown needs
`kill_job`, which the threads pool lacks. So a stage pool replaces Celery's SIGTERM/SIGINT
handlers once it is ready (`Drain.install`) and drains by itself, with a deadline of
`soft_shutdown_timeout` from the first signal:

- INIT stops consuming at once and hands back what it holds (new attempts from INIT, which
  other nodes take): starting a sandbox on a node that is leaving is wasted.
- RUN stops consuming at once, hands back the rollouts queued for it on this node (their
  sandboxes die with the node: new attempts from INIT), and lets what it holds go on only
  while the deadline leaves room for two more turns as long as the longest one so far
  (`TurnBoundary`); then each loop stops at its next turn boundary (the turn in flight
  finished and logged) and its rollout gets a new attempt from INIT, whose RUN replays the
  logged turns into a rebuilt sandbox on another node: nothing is generated twice. A RUN whose
  episode ends first hands on to EVAL as usual.
- EVAL keeps consuming until no rollout of this node is in RUN (it grades what RUN finishes
  during the drain), then stops and finishes what it holds until the deadline.

At the deadline whatever a pool still holds is handed back (`tasks.recovery.handback`): EVAL-ready
rollouts to a live node's EVAL, the rest to INIT, leases released, never left to a lease
timeout. Rollouts still queued for this node's EVAL go to live nodes too. Then the pool stops
consuming for good and exits 0 (a stage thread still busy after `EXIT_GRACE` is abandoned:
its rollout is no longer its own and its next write is fenced off).

A message that reaches a stage of a pool that no longer takes work is handed back the same
way (`decline`), so a race between the signal and the consumer loses nothing.

`InitGate`: an INIT pool consumes `init` only while its node's `run.<node>` and
`eval.<node>` queues have live consumers (`tasks.recovery.handback.LiveQueues`): a node whose RUN or
EVAL pool died takes no new work it could not finish.

`Intake` (which stages of the process still take work, and when each one's drain ends), the
`Drain` and the `InitGate` are parts of the worker process (`tasks.worker` makes them in order,
`tasks.process.parts`): the stages ask the process's `Intake` before they claim.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

from sqlalchemy import func, select

from core.db import session_scope
from core.errors import InfraError
from core.models import Rollout
from core.settings import Settings
from tasks.recovery import handback, nodes
from tasks.recovery.heartbeat import Heartbeater
from tasks.broker.config import stage_queue
from tasks.broker.publish import publish
from tasks.sandboxing.sandboxes import close_warm_pools

log = logging.getLogger(__name__)
POLL = 0.25
EXIT_GRACE = 3.0  # after the hand-back, for stage threads to return and acks to go out
GATE_INTERVAL = 1.0


class Intake:
    """Which stages of a worker process still take new work, and when each one's drain ends."""

    def __init__(self) -> None:
        self.closed: set[str] = set()  # stages of this process that take no new work
        self.deadlines: dict[str, float] = {}  # stage -> when its drain ends (time.monotonic)

    def accepting(self, stage: str) -> bool:
        """Whether this process's `stage` pool still takes new work."""
        return stage not in self.closed


class Drained(InfraError):
    """A RUN stopped at a turn boundary because its pool drains: a new attempt elsewhere
    replays its logged turns (`tasks.stages`, never a resume on this node)."""


class TurnBoundary:
    """RUN's `turn_boundary` hook (`agents.loop`): while this process's RUN pool drains, a
    loop goes on only if the drain's deadline leaves room for two turns as long as the
    longest so far (a turn cut by the deadline would be generated again); else `Drained`."""

    def __init__(self, node: str, intake: Intake) -> None:
        self.node = node
        self.intake = intake
        self.last: float | None = None  # the previous boundary
        self.longest: float | None = None  # the longest turn between two boundaries

    def __call__(self) -> None:
        now = time.monotonic()
        if self.last is not None:
            self.longest = max(self.longest or 0.0, now - self.last)
        self.last = now
        if self.intake.accepting("run"):
            return
        left = self.intake.deadlines.get("run", now) - now
        if self.longest is None or left < 2 * self.longest:
            raise Drained(f"node {self.node} drains: handed back at a turn boundary ({left:.0f}s of drain left)")


def decline(app: Any, stage: str, rollout_id: str, attempt: int) -> None:
    """A message reached a pool that no longer takes work: send its rollout on elsewhere."""
    settings = app.raas_settings
    if stage == "init":
        publish(app, "init", rollout_id, attempt)  # another node's INIT claims it
        return
    handback.hand_back_queued(settings, app, stage, f"{stage}: node {settings.node} drains", rollout_id=rollout_id)


class Drain:
    """The bounded drain of one stage pool (see module doc)."""

    def __init__(
        self, settings: Settings, app: Any, stage: str, intake: Intake, beats: Heartbeater, on_exit: Any
    ) -> None:
        self.settings = settings
        self.app = app
        self.stage = stage
        self.intake = intake
        self.beats = beats  # the leases the process holds: what it hands back at the deadline
        self.queue = stage_queue(stage, settings.node)
        self.on_exit = on_exit  # stops the consumer row's beat
        self.consumer: Any = None
        self.started: float | None = None

    def install(self, consumer: Any) -> None:
        """Take over SIGTERM and SIGINT from Celery (call from the main thread)."""
        self.consumer = consumer
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._signalled)

    def _signalled(self, signum: int, _frame: object) -> None:
        if self.started is not None:
            return  # draining already: the first deadline stands
        self.started = time.monotonic()
        self.intake.deadlines[self.stage] = self.started + self.settings.soft_shutdown_timeout
        log.warning(
            "%s pool on %s: %s, draining (deadline %.0fs)",
            self.stage.upper(),
            self.settings.node,
            signal.Signals(signum).name,
            self.settings.soft_shutdown_timeout,
        )
        threading.Thread(target=self.run, name="raas-drain", daemon=True).start()

    def run(self) -> None:
        """The drain itself, in its own thread; ends the process."""
        deadline = (self.started or time.monotonic()) + self.settings.soft_shutdown_timeout
        try:
            self._drain(deadline)
        except Exception:  # noqa: BLE001 - the process must still end; a reaper recovers
            log.exception("%s pool drain failed", self.stage.upper())
        self._exit()

    def _drain(self, deadline: float) -> None:
        why = f"{self.stage}: node {self.settings.node} drains"
        if self.stage == "eval":
            self._wait(lambda: not self._run_left(), deadline)
        self._stop_consuming()
        if self.stage == "run":
            handback.hand_back_queued(self.settings, self.app, "run", why)
        if self.stage != "init":
            self._wait(lambda: not self.beats.held(), deadline)
        left = self.beats.held()
        if left:
            n = handback.hand_back_leases(self.settings, self.app, left, f"{why}: still running at the deadline")
            log.warning("%s pool on %s handed back %s rollout(s) it held", self.stage.upper(), self.settings.node, n)
        if self.stage == "eval":
            handback.hand_back_queued(self.settings, self.app, "eval", why)

    def _run_left(self) -> int:
        """Rollouts of this node in RUN (queued or running): EVAL waits for what they hand on."""
        with session_scope(self.settings.db_url) as s:
            return (
                s.scalar(
                    select(func.count())
                    .select_from(Rollout)
                    .where(Rollout.node == self.settings.node, Rollout.status == "run")
                )
                or 0
            )

    @staticmethod
    def _wait(done: Any, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                if done():
                    return
            except Exception:  # noqa: BLE001 - a database blip: look again
                log.warning("drain: checking progress failed", exc_info=True)
            time.sleep(POLL)

    def _stop_consuming(self) -> None:
        """No new messages for this pool (a message already on its way is declined)."""
        self.intake.closed.add(self.stage)
        self.on_exit()  # no consumer row: RUN hands on to other nodes' EVAL from now on
        if self.consumer is not None:
            self.consumer.call_soon(self._cancel)

    def _cancel(self) -> None:
        try:
            self.consumer.cancel_task_queue(self.queue)
        except Exception:  # noqa: BLE001 - declined at the stage instead
            log.warning("cancelling the consumer of %s failed", self.queue, exc_info=True)

    def _exit(self) -> None:
        """Let stage threads return (their acks go out), then end the process with 0."""
        end = time.monotonic() + EXIT_GRACE
        while time.monotonic() < end and _busy():
            time.sleep(POLL)
        log.info(
            "%s pool on %s drained in %.1fs; exiting",
            self.stage.upper(),
            self.settings.node,
            time.monotonic() - (self.started or 0),
        )
        close_warm_pools()  # os._exit runs no atexit: stop the unclaimed warm sandboxes here
        logging.shutdown()
        os._exit(0)


def _busy() -> bool:
    """Whether a stage thread of this process still runs a task."""
    from celery.worker import state

    return bool(state.active_requests)


class InitGate:
    """Consume `init` only while this node's RUN and EVAL queues have live consumers."""

    def __init__(self, settings: Settings, intake: Intake, live: handback.LiveQueues) -> None:
        self.settings = settings
        self.intake = intake
        self.live = live
        self.needed = {stage_queue("run", settings.node), stage_queue("eval", settings.node)}
        self.open = True
        self.backlogged = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.consumer: Any = None
        # Pools of a node start together and register at different moments: INIT's work
        # waits in the node's queues meanwhile, so the gate only closes for a pool that is
        # missing this long after INIT started (two freshness windows).
        fresh = nodes.fresh_seconds(settings.heartbeat_interval, settings.node_timeout)
        self.closes_after = time.monotonic() + 2 * fresh

    def start(self, consumer: Any) -> None:
        """Check now and then every `GATE_INTERVAL` seconds, from a daemon thread."""
        self.consumer = consumer
        self.check()
        threading.Thread(target=self._loop, name="raas-init-gate", daemon=True).start()

    def stop(self) -> None:
        """End the gate's thread (the consumer is Celery's to close)."""
        self._stop.set()

    def check(self, cached: bool = False) -> None:
        """Open or close the gate from the live consumer rows (and the RUN backlog); called
        by the gate's thread and after every INIT task (so a fast INIT cannot run ahead:
        `cached`, the consumers as read within the last second, the backlog read anew)."""
        with self._lock:
            self._check(cached)

    def _check(self, cached: bool = False) -> None:
        try:
            missing = self.needed - self.live.read(cached=cached)
            waiting = self._waiting_for_run()
        except Exception:  # noqa: BLE001 - keep the gate as it is until the database answers
            log.warning("INIT gate: reading live consumers failed", exc_info=True)
            return
        ahead = self.settings.init_ahead
        backlog = bool(ahead and waiting >= ahead)
        if missing and self.open and time.monotonic() >= self.closes_after:
            log.warning(
                "node %s: %s has no live consumer; INIT takes no new work",
                self.settings.node,
                ", ".join(sorted(missing)),
            )
            self._set(False)
        elif not missing and backlog and self.open:
            log.debug("node %s: %s rollouts wait for RUN; INIT pauses", self.settings.node, waiting)
            self._set(False)
        elif not missing and not backlog and not self.open:
            log.log(
                logging.DEBUG if self.backlogged else logging.WARNING,
                "node %s: RUN and EVAL consume; INIT takes work",
                self.settings.node,
            )
            self._set(True)
        self.backlogged = backlog

    def _waiting_for_run(self) -> int:
        """This node's rollouts started by INIT and not yet claimed by RUN: each holds a
        sandbox that is lost if the node goes away (backpressure, `init_ahead`)."""
        if not self.settings.init_ahead:
            return 0
        with session_scope(self.settings.db_url) as s:
            return (
                s.scalar(
                    select(func.count())
                    .select_from(Rollout)
                    .where(Rollout.node == self.settings.node, Rollout.status == "run", Rollout.lease_owner.is_(None))
                )
                or 0
            )

    def _set(self, open_: bool) -> None:
        self.open = open_
        if not self.intake.accepting("init") or self.consumer is None:
            return
        action = self.consumer.add_task_queue if open_ else self.consumer.cancel_task_queue
        self.consumer.call_soon(_quietly, action, "init")

    def _loop(self) -> None:
        while self.intake.accepting("init") and not self._stop.wait(GATE_INTERVAL):
            self.check()


def _quietly(action: Any, queue: str) -> None:
    try:
        action(queue)
    except Exception:  # noqa: BLE001 - the next check tries again
        log.warning("changing the consumer of %s failed", queue, exc_info=True)
