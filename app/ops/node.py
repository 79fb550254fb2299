"""The node supervisor: one node's stage pools and its reaper as one supervised unit, in the
foreground. `raas node` is this alone; `raas up` is its gateway beside this (app/ops/embedded.py).

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
stop`; `raas up` stops it after the drain); several nodes share a broker only through
RAAS_BROKER_URL.
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
from pathlib import Path
from typing import Any

from core.settings import Settings

log = logging.getLogger(__name__)
STAGES = ("init", "run", "eval")
BACKOFF = (1.0, 60.0)  # first and longest pause before a crashed pool is started again
HEALTHY_SECONDS = 60.0  # a pool that ran this long is restarted at the first pause
KILL_GRACE = 10.0  # after the drain deadline, before a pool that did not exit is killed
TICK = 0.2
PR_SET_PDEATHSIG = 1
SUPERVISOR_PID = "RAAS_SUPERVISOR_PID"  # a pool's supervisor, for `follow_supervisor`


def follow_supervisor() -> None:
    """In a pool process its supervisor started: ask Linux for SIGTERM when the supervisor
    dies (the parent-death signal), and exit at once if it died already. Armed here, after
    exec, not in a `preexec_fn`: Python code between fork and exec in a threaded supervisor
    (the gateway's, a test's) can deadlock on a lock another thread held at fork time."""
    parent = os.environ.pop(SUPERVISOR_PID, None)  # not passed on to this pool's own children
    if parent is None or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != int(parent):  # it died before prctl took effect
        sys.exit(1)


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
    """Runs the node's pools and reaper until SIGTERM/SIGINT, then drains (see module doc).

    `env`: the pools' environment (default this process's); `logs`: a folder where each pool
    appends its output to `<stage>-<node>.log` (default this process's stdout and stderr);
    `celery`: the app the reaper and the hand-back publish with (default one of their own)."""

    def __init__(
        self,
        settings: Settings,
        slots: dict[str, int],
        reaper: bool = True,
        pool: str = "threads",
        verbose: bool = False,
        env: dict[str, str] | None = None,
        logs: Path | None = None,
        celery: Any = None,
    ) -> None:
        self.settings = settings
        self.pools = [
            Pool(stage, n)
            for stage in STAGES
            for n in process_slots(slots.get(stage, 0), settings.max_slots_per_process)
        ]
        self.init_ahead = slots.get("run", 0)  # INIT runs at most a RUN's worth ahead
        self.with_reaper = reaper
        self.pool_type = pool
        self.verbose = verbose
        self.env = {**(os.environ if env is None else env), "RAAS_HOME": str(settings.home.resolve())}
        self.env.update(RAAS_NODE=settings.node, **{SUPERVISOR_PID: str(os.getpid())})
        self.logs = logs
        self._celery = celery
        self.stop_requested = threading.Event()
        self.reaper = None

    @property
    def celery(self) -> Any:
        """The Celery app of the reaper and the hand-back (made once, when first needed)."""
        if self._celery is None:
            from tasks.celery_app import make_celery

            self._celery = make_celery(self.settings)
        return self._celery

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

    def add_pool(self, stage: str, slots: int) -> list[Pool]:
        """Start one more `stage` pool of `slots` slots (split as `process_slots` says)."""
        pools = [Pool(stage, n) for n in process_slots(slots, self.settings.max_slots_per_process)]
        for pool in pools:
            self._start(pool)
        self.pools += pools
        return pools

    def _env(self, pool: Pool) -> dict[str, str]:
        if pool.stage == "init" and self.init_ahead and "RAAS_INIT_AHEAD" not in self.env:
            return {**self.env, "RAAS_INIT_AHEAD": str(self.init_ahead)}
        return self.env

    def _start(self, pool: Pool) -> None:
        """Start a pool's process, in its own session; it arms the parent-death signal itself
        (`follow_supervisor`). Call it from the thread that supervises: Linux sends that signal
        when the thread that forked ends."""
        output = open(self.logs / f"{pool.stage}-{self.settings.node}.log", "ab") if self.logs else None
        try:
            pool.proc = subprocess.Popen(
                self._argv(pool),
                env=self._env(pool),
                stdout=output,
                stderr=subprocess.STDOUT if output else None,
                start_new_session=True,
            )
        finally:
            if output:
                output.close()  # the child has its own copy
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
        except Exception:  # its rows go stale instead: same meaning, later
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

    def run(self, announce: Callable[[], None] | None = None) -> int:
        """Supervise until a stop is requested, drain, hand back; returns the exit code.
        `announce` logs what runs once everything started (default: the node's pools)."""
        signal.signal(signal.SIGTERM, self.request_stop)
        # Background launches (`cmd &` in a script) start with SIGINT ignored: it stays so.
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, self.request_stop)
        self.start()
        try:
            (announce or self._announce)()
            while not self.stop_requested.wait(TICK):
                for pool in self.pools:
                    self._check(pool)
        finally:
            self.drain()
        return 0

    def start(self) -> None:
        """The broker (on the embedded default), the pools, then the reaper."""
        if self.settings.embedded_broker:  # once, before the pools race for it
            from tasks.broker.embedded_redis import ensure_running

            ensure_running(self.settings)
        for pool in self.pools:
            self._start(pool)
        if self.with_reaper:
            self.start_reaper()

    def _announce(self) -> None:
        log.info(
            "node %s: pools %s, reaper %s",
            self.settings.node,
            ", ".join(f"{p.stage}x{p.slots}" for p in self.pools) or "none",
            "on" if self.with_reaper else "off",
        )

    def start_reaper(self) -> Any:
        """Start (or restart) the node's reaper loop in a thread; returns the Reaper."""
        from tasks.recovery.reaper import Reaper

        self.reaper = Reaper(self.settings, self.celery)
        name = f"raas-reaper-{self.settings.node}"
        threading.Thread(target=self.reaper.run_forever, name=name, daemon=True).start()
        return self.reaper

    def stop_reaper(self) -> None:
        """Stop the reaper after its current pass (none: nothing to do)."""
        if self.reaper is not None:
            self.reaper.stop()
            self.reaper = None

    def drain(self) -> None:
        """Stop the pools, then the reaper, then hand back what is left on the node."""
        started = time.monotonic()
        self.stop_pools()
        self.stop_reaper()
        self._hand_back()
        log.info("node %s drained in %.1fs", self.settings.node, time.monotonic() - started)

    def stop_pools(self) -> None:
        """SIGTERM every pool at once, wait for them until the drain's deadline, kill stragglers."""
        deadline = time.monotonic() + self.settings.soft_shutdown_timeout + KILL_GRACE
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

    def _hand_back(self) -> None:
        """What the pools left on the node goes to nodes that can finish it."""
        from tasks.recovery.handback import hand_back_node
        from tasks.recovery.nodes import mark_gone

        try:
            moved = hand_back_node(self.settings, self.celery)
            if moved:
                log.warning("node %s: handed back %s rollout(s) at exit", self.settings.node, moved)
            mark_gone(self.settings.db_url, self.settings.node)
        except Exception:  # other nodes' reapers recover it after node_timeout
            log.exception("node %s: handing back its work failed", self.settings.node)


def describe_exit(code: int | None) -> str:
    """`code 1` or `signal SIGKILL` for a child's return code."""
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"
