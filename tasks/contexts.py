"""The one place a handler's context is built from a claimed rollout and its job.

The stages (`tasks.stages`) and re-evaluation (`tasks.reevaluate`) both start from
`rollout_context` and derive the stage's own context from it (`for_init`, `for_run`,
`for_eval`, see `agents.contexts`), so every stage sees the same identity, validated configs
and node settings, and exactly its own additions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agents.abstract import AgentHandler
from agents.contexts import EvalContext, RolloutContext
from agents.job_config import JobConfig
from core.models import Job, Rollout
from core.settings import Settings
from tasks.writes.records import stored_record


def rollout_context(
    settings: Settings,
    rollout: Rollout,
    job: Job,
    handler: AgentHandler,
    *,
    stage: str,
    attempt: int,
    started: float,
    cancel_check: Callable[[], bool] | None = None,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
    config: JobConfig | None = None,
) -> RolloutContext:
    """What every stage knows of `rollout`: its deadline is `stage`'s timeout after `started`
    (a `time.monotonic()` value: the claim, so queue time never counts)."""
    config = config or JobConfig.load(job.config)
    extra: dict[str, Any] = {} if cancel_check is None else {"cancel_check": cancel_check}
    return RolloutContext(
        rollout_id=rollout.id,
        job_id=job.id,
        instance_id=rollout.instance_id,
        instance=rollout.instance or {},
        sample_index=rollout.sample_index,
        attempt=attempt,
        agent_config=handler.load_config(config.agent_config, settings),
        job_config=config,
        settings=settings,
        deadline=started + config.limits.stage_timeout(stage),
        state=dict(rollout.state or {}),
        logger=logger,
        **extra,
    )


def eval_context(base: RolloutContext, rollout: Rollout) -> EvalContext:
    """EVAL's context (and re-evaluation's): the record and artifact RUN stored on the row."""
    return base.for_eval(stored_record(rollout), rollout.artifact)
