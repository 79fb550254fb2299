"""Start one stage's Celery worker pool on this node.

Celery's consumer reconnects after a broker outage of any length
(`broker_connection_max_retries=None`, tasks/broker/config.py), and an error that would still end it
restarts it in this process (`tasks.broker.acks.StageConsumer`); the process exits non-zero only if
Celery itself gives up, so a supervisor (`raas node`, `raas up`, systemd) starts a new pool.
While it lives, it beats a `queue_consumers` row (tasks/recovery/nodes.py) that tells the reaper and
the node's INIT gate that the queue has a reader. SIGTERM/SIGINT drain it within
`soft_shutdown_timeout` (tasks/recovery/drain.py).

What lives as long as the process is one object, `ProcessParts` (tasks/process/parts.py), hung on
the Celery app as `app.raas_parts`: the parts every process running stage tasks has
(`stage_steps`) and the pool's own (`pool_steps`), started when the pool is ready in the order
their steps declare and stopped in reverse when it shuts down.
"""

from __future__ import annotations

import gc
import logging
import os
import warnings

from celery.platforms import SecurityWarning
from celery.signals import (
    task_postrun,
    worker_init,
    worker_process_init,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)

from agents.llm.backends import http_client
from agents.registry import load_handler_modules
from core.db import configure_pool, use_pre_ping
from core.settings import Settings
from tasks.writes import db_retry
from tasks.recovery import nodes
from tasks.writes.cancels import DROPPED, CancelMemory
from tasks.celery_app import make_celery
from tasks.broker.config import stage_queue
from tasks.llm.llm_pool import PoolMemory
from tasks.process.parts import ProcessParts, Step
from tasks.recovery.drain import Drain, InitGate, Intake
from tasks.recovery.handback import LiveQueues
from tasks.recovery.heartbeat import Heartbeater
from tasks.recovery.nodes import ConsumerBeat
from tasks.sandboxing.sandboxes import check_node_settings
from tasks.writes.outbox_marks import MarkClearer
from tasks.writes.turn_log import TurnLog

log = logging.getLogger(__name__)


def worker_argv(
    settings: Settings, stage: str, concurrency: int, pool: str, loglevel: str, quiet: bool = False
) -> list[str]:
    """Celery worker arguments: one queue, the stage's pool, no chatter between workers
    (and no start-up banner when quiet)."""
    return [
        *(["--quiet"] if quiet else []),
        "worker",
        "-Q",
        stage_queue(stage, settings.node),
        "-P",
        pool,
        "-c",
        str(concurrency),
        "-n",
        f"{stage}@{settings.node}-{os.getpid()}",
        "-l",
        loglevel,
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]


def consumer_beat_interval(settings: Settings) -> float:
    """How often a pool beats its consumer row: four beats per `node_timeout`."""
    return nodes.consumer_beat_interval(settings.heartbeat_interval, settings.node_timeout)


def stop_stale_sandboxes(settings: Settings) -> int:
    """The node's start-up pass, before this pool takes work: stop sandboxes of attempts
    that ended or restarted elsewhere (the node may be back after being judged dead)."""
    from tasks.recovery.reaper import Reaper

    try:
        return Reaper(settings, celery=None).sweep_sandboxes()
    except Exception:  # the reaper sweeps again; a pool must still start
        log.exception("start-up sandbox sweep failed")
        return 0


# Young-generation threshold of a stage worker (CPython's default is 700 allocations).
GC_THRESHOLD = (20_000, 10, 10)


def tune_gc() -> None:
    """Fewer, cheaper garbage collections in a stage worker: what the process imported at
    start (Celery, SQLAlchemy, transformers) moves to the permanent generation, never scanned
    again, and a young collection runs every GC_THRESHOLD[0] allocations instead of 700. The
    RUN hot path allocates short-lived lists and dicts by the thousand per turn (token ids,
    rows, JSON); collecting them at CPython's default pace was ~5 % of a RUN worker's CPU."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


def stage_steps(settings: Settings) -> list[Step]:
    """The parts of every process that runs stage tasks, in start order: what the stages ask
    before claiming (`Intake`, `CancelMemory`), the caches their hand-ons and LLM pools share,
    the heartbeat of the leases they hold, and the writers that work off their threads (the
    turn log, the hand-on marks' clears), which are flushed when the process stops while the
    heartbeat still beats for the leases they write under."""
    db = settings.db_url
    return [
        Step(Intake, lambda parts: Intake()),
        Step(CancelMemory, lambda parts: CancelMemory()),
        Step(LiveQueues, lambda parts: LiveQueues(settings)),
        Step(PoolMemory, lambda parts: PoolMemory()),
        Step(Heartbeater, lambda parts: Heartbeater(db, settings.heartbeat_interval)),
        Step(TurnLog, lambda parts: TurnLog(db, settings.turn_batch_window), requires=(Heartbeater,)),
        Step(MarkClearer, lambda parts: MarkClearer(db), requires=(Heartbeater,)),
    ]


def pool_steps(settings: Settings, app: object, stage: str) -> list[Step]:
    """The parts of a stage pool's own process, after the stage parts: its `queue_consumers`
    row (beaten only once the stages can work, removed first), the bounded drain that takes
    over SIGTERM/SIGINT from Celery once the consumer is ready, and INIT's gate."""
    queue = stage_queue(stage, settings.node)
    interval = consumer_beat_interval(settings)
    steps: list[Step] = [
        Step(
            ConsumerBeat,
            lambda parts: ConsumerBeat(settings.db_url, settings.node, queue, interval),
            requires=(Intake, Heartbeater, TurnLog, MarkClearer),
        ),
        Step(
            Drain,
            lambda parts: Drain(
                settings, app, stage, parts.get(Intake), parts.get(Heartbeater), on_exit=parts.get(ConsumerBeat).stop
            ),
            requires=(Intake, Heartbeater, ConsumerBeat),
            start=lambda drain, parts: drain.install(parts.consumer),  # SIGTERM/SIGINT: ours
        ),
    ]
    if stage == "init":
        steps.append(
            Step(
                InitGate,
                lambda parts: InitGate(settings, parts.get(Intake), parts.get(LiveQueues)),
                requires=(Intake, LiveQueues, ConsumerBeat),
                start=lambda gate, parts: gate.start(parts.consumer),
            )
        )
    return steps


def run_worker(
    settings: Settings, stage: str, concurrency: int, pool: str = "threads", loglevel: str = "INFO", quiet: bool = False
) -> int:
    """Block running the worker; returns the process exit code (non-zero when the pool
    ended on an error, e.g. its consumer died)."""
    load_handler_modules(settings.handler_modules)
    check_node_settings(settings)
    configure_pool(settings)  # a few connections shared by all `concurrency` threads
    use_pre_ping(False)
    http_client.configure(concurrency)  # keep-alive connections for every slot
    db_retry.configure(
        settings.lease_timeout if settings.db_retry_seconds is None else settings.db_retry_seconds
    )  # an outage shorter than the lease
    app = make_celery(settings)
    queue = stage_queue(stage, settings.node)
    if quiet:
        # Celery warns on every start as root; stage code never runs agent code (sandboxes
        # do), and root is how containers run: not something the operator can act on.
        warnings.filterwarnings("ignore", category=SecurityWarning)
    stop_stale_sandboxes(settings)
    parts = app.raas_parts = ProcessParts([*stage_steps(settings), *pool_steps(settings, app, stage)])
    gate = parts.get(InitGate) if parts.has(InitGate) else None

    @worker_ready.connect(weak=False)
    def _ready(sender: object = None, **_: object) -> None:
        tune_gc()
        parts.start(consumer=sender)
        log.info("%s pool ready: queue %s, %s %s, pid %s", stage.upper(), queue, concurrency, pool, os.getpid())

    @worker_process_init.connect(weak=False)
    def _child(**_: object) -> None:  # a prefork child runs the stages: parts of its own
        app.raas_parts = ProcessParts(stage_steps(settings)).start()

    @worker_shutting_down.connect(weak=False)
    def _shutting_down(**_: object) -> None:
        app.raas_parts.shutting_down.set()  # sandboxes that die from now on die with the node

    @worker_shutdown.connect(weak=False)
    def _shutdown(**_: object) -> None:
        parts.stop()

    if gate is not None:

        @task_postrun.connect(weak=False)
        def _after_init(retval: object = None, **_: object) -> None:
            if retval == DROPPED:  # a cancelled job's stale message: nothing was handed on
                return
            gate.check(cached=True)  # an INIT handed a rollout on: backpressure first

    workers: list[object] = []

    @worker_init.connect(weak=False)
    def _init(sender: object = None, **_: object) -> None:
        workers.append(sender)

    # `worker_main` drops the exit code Celery computed (an "Unrecoverable error" sets 1 on
    # the WorkController, yet the process ended with 0): read it from the controller.
    app.worker_main(worker_argv(settings, stage, concurrency, pool, loglevel, quiet))
    code = getattr(workers[0], "exitcode", None) if workers else 1
    if code:
        log.error("%s pool on %s exits with code %s", stage.upper(), settings.node, code)
    return int(code or 0)
