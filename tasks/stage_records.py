"""What a stage's result or failure becomes in the rollout's record: which failures are
infrastructure (a new attempt), whether RUN's result ends the rollout without EVAL, RUN's
record as the rollout's columns, a failure's one-line text and a diverged replay's note for the
attempt history. Pure functions of the result; the stages (`tasks.stages`) write them."""

from __future__ import annotations

import traceback
from typing import Any

from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from raas_client.models import Trajectory

from agents.finish_reasons import POLICY_DEADLINE, SELF_INFLICTED
from core.errors import InfraError
from core.models import Outcome
from sandbox import SandboxError
from tasks.writes import db_retry
from tasks.writes.records import record_fields

# Infrastructure trouble gets a new attempt; sqlalchemy's OperationalError covers a database
# that restarted under us (its connections are dropped and the next checkout reconnects).
# Sandbox infrastructure errors have their own root (the sandbox package is standalone).
# PoolTimeout: no pooled connection came free within `db_pool_timeout` (an overloaded database).
# A driver's own disconnect error (`db_retry.DRIVER_DISCONNECTS`) is the same outage, whichever
# layer raised it: never a final `infra_error` on the first attempt (issue 40).
RETRYABLE = (
    InfraError,
    SandboxError,
    ConnectionError,
    TimeoutError,
    OSError,
    OperationalError,
    PoolTimeout,
    *db_retry.DRIVER_DISCONNECTS,
)


def describe(exc: BaseException, stage: str) -> str:
    """A failure in one line for the rollout's `error`: the stage, the exception's type and text."""
    tail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return f"{stage}: {tail}"


def ungraded(result: Trajectory) -> bool:
    """Whether RUN's result ends the rollout without EVAL (`StageRun._end_ungraded` in `tasks.stages`)."""
    return (
        result.outcome in (Outcome.PROMPT_TOO_LONG.value, Outcome.INFRA_ERROR.value)
        or result.finish_reason in SELF_INFLICTED
        or (result.outcome, result.finish_reason) == POLICY_DEADLINE
    )


def divergences(exc: BaseException) -> dict[str, Any]:
    """A diverged replay's record for the attempt history (`ReplayDiverged`)."""
    found = getattr(exc, "details", {}).get("divergences")
    return {"replay_divergences": found} if found else {}


INIT_METRICS = ("sandbox_start",)  # what INIT measured, kept beside RUN's metrics


def run_fields(result: Trajectory, before: dict[str, Any] | None = None) -> dict[str, Any]:
    """RUN's record as the rollout's columns (a handler that set no outcome completed); the
    metrics INIT saved on the row (`before`) are kept."""
    fields = record_fields(result)
    fields["outcome"] = fields["outcome"] or Outcome.COMPLETED.value
    kept = {k: v for k, v in (before or {}).items() if k in INIT_METRICS}
    if kept:
        fields["metrics"] = {**kept, **(fields.get("metrics") or {})}
    return fields
