"""The one place that owns Celery's queues, router and reliability settings.

Queues: `init` is shared by every node; `run.<node>` and `eval.<node>` belong to the node that
started the rollout's sandbox (its Unix socket is local). `route_stage` is the only router and
every process uses it, so whichever worker publishes the next link routes it the same way.
A stage message without a node falls to `UNROUTED_QUEUE`, which no worker consumes and
`/metrics` reports, so a routing bug shows up as a growing gauge instead of lost work.
"""

from __future__ import annotations

from typing import Any

from core.settings import Settings

INIT_QUEUE = "init"
UNROUTED_QUEUE = "raas.unrouted"
STAGES = ("init", "run", "eval")
TASK_NAMES = {stage: f"raas.{stage}" for stage in STAGES}
REEVALUATE_TASK = "raas.reevaluate"
# Where a done rollout keeps its accepted, not yet recorded re-evaluation requests (`extra`).
PENDING_REEVALUATIONS = "reevaluations_pending"
# Keys of a rollout's `extra` that are the pipeline's own bookkeeping, never part of the record a
# trainer receives (`tasks.writes.records.wire_fields` leaves them out of the gateway's answers).
PIPELINE_EXTRA_KEYS = frozenset({PENDING_REEVALUATIONS})


def stage_queue(stage: str, node: str | None = None) -> str:
    """The queue a stage's message goes to (`node` is required for run and eval)."""
    if stage == "init":
        return INIT_QUEUE
    if stage not in STAGES or not node:
        return UNROUTED_QUEUE
    return f"{stage}.{node}"


def route_stage(name: str, args: Any, kwargs: dict | None, options: dict, task: Any = None, **_: Any) -> dict | None:
    """Celery router: stage tasks go to their stage queue on the node named in kwargs."""
    for stage, task_name in TASK_NAMES.items():
        if name == task_name:
            return {"queue": stage_queue(stage, (kwargs or {}).get("node"))}
    if name == REEVALUATE_TASK:  # needs a fresh sandbox on any node, like INIT
        return {"queue": INIT_QUEUE}
    return None


# Message priorities: a job's `priority` (0-9, higher first) becomes the message priority
# 9 - priority, because kombu serves lower numbers first (Redis, embedded or not: one list per
# step, BRPOP in step order). Messages sent without one (none of ours) would take 0, the top:
# `task_default_priority` keeps them at the default job's.
PRIORITY_STEPS = list(range(10))
DEFAULT_PRIORITY = 0


def message_priority(job_priority: int | None) -> int:
    """The broker priority of a job's stage messages (lower is served first)."""
    return 9 - max(0, min(9, job_priority or DEFAULT_PRIORITY))


def publish_retry_policy(seconds: float) -> dict[str, Any]:
    """kombu's retry policy for a publish that may wait about `seconds` for the broker.

    kombu sleeps `interval_start`, then `interval_step` more each retry, capped at
    `interval_max`; the retries are counted so that the sleeps add up to `seconds` (a Redis
    restart takes a few seconds; a stage hand-off must not give up on it in Celery's default
    0.6 s, nor hold its worker slot much longer than the operator allows).
    """
    start, step, cap = 0.0, 0.5, 2.0
    retries, slept = 0, 0.0
    while slept < seconds:
        slept += min(start + step * retries, cap)
        retries += 1
    return {"max_retries": retries, "interval_start": start, "interval_step": step, "interval_max": cap}


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery settings for `settings`' broker, each with the reason it is there."""
    transport: dict[str, Any] = {
        # No copy of each delivered message in Redis until its ack (kombu's ack emulation:
        # MULTI/ZADD/HSET/EXEC on delivery and MULTI/ZREM/HDEL/EXEC on ack, 8 of ~11 commands
        # and 2 of 4 round trips per hand-on, bench/broker_commands.py). It did no work for
        # raas: the copy came back only after the visibility timeout, hours after the reaper
        # had recovered the rollout from the database (a lost lease: resume or a new attempt;
        # a queued rollout whose message is gone: re-published). What it still does is kept
        # in process: a rejected or not yet started message (a drain, a consumer restart) is
        # put back on its queue when the channel closes.
        "ack_emulation": False,
        # With ack emulation back on, Redis would redeliver an unacked message after this
        # long: it must exceed the longest rollout or a healthy long run would run twice.
        "visibility_timeout": int(settings.max_rollout_seconds * 1.5) + 600,
        # One list per job priority (kombu's default has four steps): a high-priority job's
        # messages are taken before any backlog of lower ones (BRPOP reads steps in order).
        "priority_steps": PRIORITY_STEPS,
    }
    if settings.broker_key_prefix:
        transport["global_keyprefix"] = settings.broker_key_prefix
    return {
        "broker_url": settings.broker,
        "broker_transport_options": transport,
        # Retry the broker at start-up instead of crashing a worker that came up first.
        "broker_connection_retry_on_startup": True,
        # ...and after losing it, for as long as the outage lasts (Celery's default gives up
        # after 100 tries, ~50 min, and the worker exits).
        "broker_connection_retry": True,
        "broker_connection_max_retries": None,
        # A channel error (e.g. Redis refusing writes while it loads its data) restarts the
        # consumer like a connection error instead of ending the worker.
        "broker_channel_error_retry": True,
        # Acks that cannot reach the broker are logged, not raised into the consumer's loop.
        "task_annotations": {"*": {"Request": "tasks.broker.acks:StageRequest"}},
        # ...and an error that would still end the consumer restarts it in-process.
        "worker_consumer": "tasks.broker.acks:StageConsumer",
        # Ack after the stage ran, so a worker that dies mid-stage leaves the message to redo.
        "task_acks_late": True,
        # ...and requeue it when the worker process is killed, not just when the task raises.
        "task_reject_on_worker_lost": True,
        # One message per free slot: a long agent loop must not sit on prefetched work.
        "worker_prefetch_multiplier": 1,
        # SIGTERM/SIGINT are our bounded drain (tasks/recovery/drain.py: finish, then hand back, within
        # soft_shutdown_timeout); this bounds Celery's own soft shutdown, which only SIGQUIT
        # reaches now (its cold shutdown after it needs kill_job, which threads lack).
        "worker_soft_shutdown_timeout": settings.soft_shutdown_timeout,
        "worker_enable_soft_shutdown_on_idle": True,
        # Misrouted messages land where nobody consumes them and metrics can see them.
        "task_default_queue": UNROUTED_QUEUE,
        "task_create_missing_queues": True,
        "task_routes": (route_stage,),
        # A message sent without a priority waits like the default job's, not above all.
        "task_default_priority": message_priority(DEFAULT_PRIORITY),
        # Results live in the database; Celery's result backend would be a second truth.
        "task_ignore_result": True,
        "result_backend": None,
        "task_serializer": "json",
        "accept_content": ["json"],
        # Stage tasks keep their own deadlines; a broker hiccup must not cancel them.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        # Task events feed Flower's task views; off by default, they cost broker traffic.
        "worker_send_task_events": settings.task_events,
        "task_send_sent_event": settings.task_events,
        "worker_hijack_root_logger": False,
        "worker_redirect_stdouts": False,
    }
