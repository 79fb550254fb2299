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


def llm_session(
    settings: Settings,
    config: JobConfig,
    handler: AgentHandler,
    job: Job,
    db_url: str,
    lease: str,
    claimed: Any,
    parts: Any,
) -> Any:
    """A RUN's LLM session on the job's typed llm spec and sampling, its pool statements retried
    through a database outage (None when the handler generates nothing)."""
    if not handler.needs_llm:
        return None
    from agents.llm import LLMSession
    from agents.llm.spec import LLMSpec
    from core.owners import url_rules_for
    from tasks.llm.llm_pool import PoolMemory, make_pool
    from tasks.writes import db_retry
    from tasks.writes.turn_log import TurnLog

    spec = config.llm or LLMSpec()
    pool = db_retry.Retrying(
        make_pool(
            spec,
            db_url,
            claimed.id,
            lease,
            job.owner,
            claimed=claimed,
            writes=parts.get(TurnLog),
            memory=parts.get(PoolMemory),
        )
    )
    return LLMSession.open(
        spec,
        config.sampling,
        claimed.id,
        pool,
        policy=settings.policy.llm,
        url_rules=url_rules_for(settings, job.owner),
    )
