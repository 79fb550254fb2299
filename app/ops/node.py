"""`raas node`: one node's stage pools and its reaper as one supervised unit, in the foreground.

Each stage pool is one or more child processes (`raas worker --stage ...`: a pool of more than
`max_slots_per_process` slots is split evenly, `process_slots`), each in its own session, so a terminal's
Ctrl-C or a signal to the process group reaches this command only and the drain keeps its
order, and with a parent-death signal (SIGTERM), so the pools drain and exit with this command
whatever Slurm's proctrack plugin does with it. A pool that exits is started again with a
backoff (1 s doubling to 60 s; one that ran a minute starts over at 1 s) and a log line; its
consumer rows go at once, so the node's INIT stops taking work for that path right away.
The reaper runs in a thread.

SIGTERM (or SIGINT) drains, bounded by `RAAS_SOFT_SHUTDOWN_TIMEOUT` (tasks/recovery/drain.py says what
each pool does): every pool gets SIGTERM at once; INIT stops taking work and hands back what
it holds; RUN and EVAL finish what they hold until the deadline, EVAL taking work until the
node's RUN has drained; what is still running then is handed back. Sandboxes of running
rollouts live through the drain (this command never signals its process group). A pool still
there `KILL_GRACE` seconds after the deadline is killed. Then what is left on the node is
handed back (`tasks.recovery.handback.hand_back_node`), the node's row is marked stale so other nodes'
reapers take over at once, and the command exits 0.

On the embedded default (no RAAS_BROKER_URL) the node starts the home's Redis server unless it
runs, and leaves it running at exit (a gateway of the same home may use it: `raas broker
stop`); several nodes share a broker only through RAAS_BROKER_URL.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from core.settings import Settings

log = logging.getLogger(__name__)
STAGES = ("init", "run", "eval")
BACKOFF = (1.0, 60.0)  # first and longest pause before a crashed pool is started again
HEALTHY_SECONDS = 60.0  # a pool that ran this long is restarted at the first pause
KILL_GRACE = 10.0  # after the drain deadline, before a pool that did not exit is killed
TICK = 0.2
PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` that asks Linux to send `sig` to the child when `parent` dies."""
    if not sys.platform.startswith("linux"):
        return None
    # Looked up here, in the parent: the child of a threaded process must not load libraries
    # (a lock another thread held at fork time would never be released there).
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def process_slots(slots: int, per_process: int) -> list[int]:
    """A pool's slots as worker processes: as few as hold at most `per_process` slots each,
    evenly split (70 at 32 -> [24, 23, 23]; 0 -> no process). Threads of one process share
    its GIL: past a few dozen agent loops in one process, the loops wait on each other's
    Python work, not on the LLM (the latency the bound assumes)."""
    if slots <= 0:
        return []
    count = -(-slots // per_process)
    base, extra = divmod(slots, count)
    return [base + (1 if i < extra else 0) for i in range(count)]


class Pool:
    """One worker process of a stage pool of the node: its process, restarts and backoff."""

    def __init__(self, stage: str, slots: int) -> None:
        self.stage = stage
        self.slots = slots
        self.proc: subprocess.Popen | None = None
        self.started = 0.0
        self.pause = BACKOFF[0]
        self.due = 0.0  # monotonic time the next start may happen
        self.restarts = 0

    def alive(self) -> bool:
        """Whether its process runs now."""
        return self.proc is not None and self.proc.poll() is None


class NodeSupervisor:
    """Runs the node's pools and reaper until SIGTERM/SIGINT, then drains (see module doc)."""

    def __init__(
        self,
        settings: Settings,
        slots: dict[str, int],
        reaper: bool = True,
        pool: str = "threads",
        verbose: bool = False,
    ) -> None:
        self.settings = settings
        self.pools = [
            Pool(stage, n)
            for stage in STAGES
            for n in process_slots(slots.get(stage, 0), settings.max_slots_per_process)
        ]
        self.with_reaper = reaper
        self.pool_type = pool
        self.verbose = verbose
        self.stop_requested = threading.Event()
        self.reaper = None
        self._preexec = die_with_parent(os.getpid())

    # -- the pools -----------------------------------------------------------------------
    def _argv(self, pool: Pool) -> list[str]:
        return [
            sys.executable,
            "-m",
            "app.ops.cli",
            "worker",
            "--stage",
            pool.stage,
            "--node",
            self.settings.node,
            "--concurrency",
            str(pool.slots),
            "--pool",
            self.pool_type,
            *(["--verbose"] if self.verbose else []),
        ]

    def _start(self, pool: Pool) -> None:
        """Start a pool's process (from the main thread: Linux ties the parent-death signal
        to the thread that forked)."""
        env = {**os.environ, "RAAS_NODE": self.settings.node}
        run_slots = sum(p.slots for p in self.pools if p.stage == "run")
        if pool.stage == "init" and run_slots:  # INIT runs at most a RUN's worth ahead
            env.setdefault("RAAS_INIT_AHEAD", str(run_slots))
        pool.proc = subprocess.Popen(self._argv(pool), env=env, start_new_session=True, preexec_fn=self._preexec)
        pool.started = time.monotonic()
        log.info("%s pool started: pid %s, %s slots", pool.stage.upper(), pool.proc.pid, pool.slots)

    def _check(self, pool: Pool) -> None:
        """Restart a pool that exited, once its backoff has passed."""
        if pool.alive():
            return
        now = time.monotonic()
        if pool.proc is not None:  # it just exited: note it, forget its rows, wait
            code = pool.proc.returncode
            ran = now - pool.started
            pool.pause = BACKOFF[0] if ran > HEALTHY_SECONDS else min(pool.pause * 2, BACKOFF[1])
            pool.due = now + (BACKOFF[0] if ran > HEALTHY_SECONDS else pool.pause)
            log.warning(
                "%s pool (pid %s) exited with %s after %.0fs; starting a new one in %.0fs",
                pool.stage.upper(),
                pool.proc.pid,
                describe_exit(code),
                ran,
                pool.due - now,
            )
            self._forget(pool.proc.pid)
            pool.proc = None
            pool.restarts += 1
        if now >= pool.due:
            self._start(pool)

    def _forget(self, pid: int) -> None:
        from tasks.recovery.nodes import forget_consumers

        try:
            forget_consumers(self.settings.db_url, self.settings.node, pid)
        except Exception:  # noqa: BLE001 - its rows go stale instead: same meaning, later
            log.exception("removing the consumer rows of pid %s failed", pid)

    # -- the loop ------------------------------------------------------------------------
    def request_stop(self, signum: int = signal.SIGTERM, _frame: object = None) -> None:
        """Signal handler: drain (a second signal changes nothing)."""
        if not self.stop_requested.is_set():
            log.warning(
                "node %s: %s, draining (up to %.0fs)",
                self.settings.node,
                signal.Signals(signum).name,
                self.settings.soft_shutdown_timeout,
            )
        self.stop_requested.set()

    def run(self) -> int:
        """Supervise until a stop is requested, drain, hand back; returns the exit code."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.request_stop)
        if self.settings.embedded_broker:  # once, before the pools race for it
            from tasks.broker.embedded_redis import ensure_running

            ensure_running(self.settings)
        for pool in self.pools:
            self._start(pool)
        self._start_reaper()
        log.info(
            "node %s: pools %s, reaper %s",
            self.settings.node,
            ", ".join(f"{p.stage}x{p.slots}" for p in self.pools) or "none",
            "on" if self.with_reaper else "off",
        )
        while not self.stop_requested.wait(TICK):
            for pool in self.pools:
                self._check(pool)
        self._drain()
        return 0

    def _start_reaper(self) -> None:
        if not self.with_reaper:
            return
        from tasks.celery_app import make_celery
        from tasks.recovery.reaper import Reaper

        self.reaper = Reaper(self.settings, make_celery(self.settings))
        threading.Thread(target=self.reaper.run_forever, name="raas-reaper", daemon=True).start()

    def _drain(self) -> None:
        """SIGTERM every pool, wait for them (killing stragglers), hand back the rest."""
        started = time.monotonic()
        deadline = started + self.settings.soft_shutdown_timeout + KILL_GRACE
        running = [p for p in self.pools if p.alive()]
        for pool in running:
            pool.proc.send_signal(signal.SIGTERM)
        for pool in running:
            try:
                pool.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("%s pool (pid %s) did not drain in time: killed", pool.stage.upper(), pool.proc.pid)
                pool.proc.kill()
                pool.proc.wait()
            self._forget(pool.proc.pid)
        if self.reaper is not None:
            self.reaper.stop()
        self._hand_back()
        log.info("node %s drained in %.1fs", self.settings.node, time.monotonic() - started)

    def _hand_back(self) -> None:
        """What the pools left on the node goes to nodes that can finish it."""
        from tasks.celery_app import make_celery
        from tasks.recovery.handback import hand_back_node
        from tasks.recovery.nodes import mark_gone

        try:
            moved = hand_back_node(self.settings, make_celery(self.settings))
            if moved:
                log.warning("node %s: handed back %s rollout(s) at exit", self.settings.node, moved)
            mark_gone(self.settings.db_url, self.settings.node)
        except Exception:  # noqa: BLE001 - other nodes' reapers recover it after node_timeout
            log.exception("node %s: handing back its work failed", self.settings.node)


def describe_exit(code: int | None) -> str:
    """`code 1` or `signal SIGKILL` for a child's return code."""
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"
