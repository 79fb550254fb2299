"""Publishing a stage message: the one call every process uses to queue a stage."""
from __future__ import annotations

from typing import Any

from tasks.config import TASK_NAMES, publish_retry_policy


def publish(app: Any, stage: str, rollout_id: str, attempt: int, node: str | None = None,
            producer: Any = None, retry_seconds: float = 0.0) -> None:
    """Publish a stage message; the shared router picks the queue from `node`.

    With `retry_seconds`, kombu reconnects and retries a broker that is away for about that
    long (else Celery's default policy, well under a second); then kombu's error is raised.
    """
    kwargs = {"node": node} if node else {}
    retry = {"retry": True, "retry_policy": publish_retry_policy(retry_seconds)} \
        if retry_seconds else {}
    app.send_task(TASK_NAMES[stage], args=[rollout_id, attempt], kwargs=kwargs,
                  producer=producer, **retry)
