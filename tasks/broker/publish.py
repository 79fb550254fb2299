"""Publishing a stage message: the one place a stage message is built, used by every process
to queue a stage (one at a time here, in batches over one producer by `tasks.broker.outbox`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tasks.broker.config import REEVALUATE_TASK, TASK_NAMES, message_priority, publish_retry_policy


@dataclass(frozen=True, slots=True)
class StageMessage:
    """One stage message to publish: which stage of which rollout attempt, the node whose
    queue takes it (RUN and EVAL), the job (drops of cancelled INITs) and its priority."""

    stage: str
    rollout_id: str
    attempt: int
    node: str | None = None
    job: str | None = None
    priority: int | None = None


def publish(
    app: Any,
    stage: str,
    rollout_id: str,
    attempt: int,
    node: str | None = None,
    producer: Any = None,
    retry_seconds: float = 0.0,
    priority: int | None = None,
    job: str | None = None,
) -> None:
    """Publish a stage message; the shared router picks the queue from `node`.

    With `retry_seconds`, kombu reconnects and retries a broker that is away for about that
    long (else Celery's default policy, well under a second); then kombu's error is raised.
    `priority` is the job's (higher first). `job` lets a worker drop INIT messages of a job it
    knows was cancelled without a database write (see `cancels.CancelMemory.known_cancelled`); it also
    rides in the headers with the attempt, where the cancel's broker purge reads them
    (`tasks.broker.purge`: the body is base64 in Redis).
    """
    kwargs = {k: v for k, v in (("node", node), ("job", job)) if v}
    headers = {"raas_job": job, "raas_attempt": attempt} if job else None
    retry = {"retry": True, "retry_policy": publish_retry_policy(retry_seconds)} if retry_seconds else {}
    app.send_task(
        TASK_NAMES[stage],
        args=[rollout_id, attempt],
        kwargs=kwargs,
        producer=producer,
        priority=message_priority(priority),
        headers=headers,
        **retry,
    )


def publish_reevaluation_message(app: Any, rollout_id: str, request_id: str) -> None:
    """Publish a re-evaluation request (`tasks.reevaluate`), routed to the shared INIT queue."""
    app.send_task(REEVALUATE_TASK, args=[rollout_id, request_id])
