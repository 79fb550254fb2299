"""Validation requests and the quarantine lists they write (the service side of `raas validate`).

A request is checked like a job submission (agent, handler config, every instance), stored as a
`validations` row, and graded by the `raas.validate` task on the `init` queue (or in the
calling process by `raas validate`). A done run with a name is its owner's quarantine list of
that name; a job that names the list (`quarantine`) is refused for every listed instance.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import Field
from raas_client.validation_models import InstanceValidation, QuarantineView, ValidationView
from sqlalchemy import select
from sqlalchemy.orm import Session

from agents import gold
from agents.job_config import JobConfig, Limits
from agents.registry import get_handler
from app.schemas import Instance, Strict
from core.db import session_scope
from core.errors import InvalidRequest, NotFound
from core.models import Validation
from core.policy import check_sandbox_options
from core.settings import Settings
from sandbox.spec import SandboxOptions

log = logging.getLogger(__name__)

LIST_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class ValidationCreate(Strict):
    """POST /v1/validations: grade every instance's gold solution and null action k times."""

    agent: str = Field(min_length=1, description="Registered handler whose EVAL grades (swe, code, math)")
    instances: list[Instance] = Field(min_length=1, max_length=10_000, description="The data set")
    k: int = Field(3, ge=1, le=20, description="Grades per action per instance (flakiness shows past 1)")
    name: str | None = Field(
        None, pattern=LIST_NAME, description="Write the quarantine list of this name (jobs name it as `quarantine`)"
    )
    agent_config: dict[str, Any] = Field(default_factory=dict, description="Handler config, as the job's")
    limits: Limits = Field(default_factory=Limits, description="eval_timeout bounds each grade")
    sandbox: SandboxOptions = Field(default_factory=SandboxOptions, description="The job's sandbox options")


def checked_request(settings: Settings, body: ValidationCreate) -> dict[str, Any]:
    """The stored request of a validation, checked as a job submission would be."""
    gold.check_agent(body.agent)
    handler = get_handler(body.agent)
    try:
        config = handler.load_config(body.agent_config, settings)
    except ValueError as exc:
        raise InvalidRequest(f"agent_config: {exc}", field="agent_config") from exc
    handler.check_policy(config, settings.policy, True)
    check_sandbox_options(settings.policy.sandbox, body.sandbox)
    job_config = JobConfig(limits=body.limits, sandbox=body.sandbox, agent_config=config.model_dump())
    return {
        "config": job_config.dump(),
        "instances": [{"instance_id": i.instance_id, "data": i.data} for i in body.instances],
    }


def create_validation(settings: Settings, body: ValidationCreate, owner: str) -> str:
    """Store a validation request (pending) and return its id."""
    request = checked_request(settings, body)
    with session_scope(settings.db_url) as s:
        row = Validation(owner=owner, name=body.name, agent=body.agent, k=body.k, status="pending", request=request)
        s.add(row)
        s.flush()
        return row.id


def publish(celery: Any, validation_id: str) -> None:
    """Hand a stored request to the `init` queue's workers (grading sandboxes start anywhere)."""
    from tasks.broker.config import INIT_QUEUE
    from tasks.validation import VALIDATE_TASK

    celery.send_task(VALIDATE_TASK, args=[validation_id], queue=INIT_QUEUE)


def view(row: Validation) -> ValidationView:
    """The wire view of a validation row."""
    return ValidationView(
        validation_id=row.id,
        name=row.name,
        agent=row.agent,
        k=row.k,
        status=row.status,
        instances=[InstanceValidation.model_validate(r) for r in row.report or []],
        quarantined=list(row.quarantined or []),
        seconds=row.seconds,
        error=row.error,
        created_at=row.created_at,
        finished_at=row.finished_at,
    )


def get_validation(s: Session, validation_id: str, owner: str) -> Validation:
    """The owner's validation row, or NotFound."""
    row = s.get(Validation, validation_id)
    if row is None or row.owner != owner:
        raise NotFound(f"validation {validation_id} not found")
    return row


def quarantine(s: Session, owner: str, name: str) -> QuarantineView | None:
    """The owner's quarantine list `name`: the newest done validation of that name."""
    row = s.execute(
        select(Validation)
        .where(Validation.owner == owner, Validation.name == name, Validation.status == "done")
        .order_by(Validation.finished_at.desc())
        .limit(1)
    ).scalar_one_or_none()
    if row is None:
        return None
    reasons = {r["instance_id"]: r.get("problems", []) for r in row.report or [] if r.get("problems")}
    return QuarantineView(
        name=name,
        instance_ids=list(row.quarantined or []),
        reasons=reasons,
        validation_id=row.id,
        updated_at=row.finished_at,
    )


def check_quarantine(settings: Settings, owner: str, name: str, instance_ids: list[str]) -> None:
    """Refuse a submission naming list `name` when it holds any of `instance_ids` (or the list
    does not exist); the error names every refused instance and its problems."""
    with session_scope(settings.db_url) as s:
        listed = quarantine(s, owner, name)
    if listed is None:
        raise InvalidRequest(f"quarantine list {name!r} does not exist (run raas validate --name)", field="quarantine")
    refused = [i for i in instance_ids if i in set(listed.instance_ids)]
    if refused:
        detail = ", ".join(f"{i} ({'/'.join(listed.reasons.get(i, []))})" for i in refused[:20])
        more = f" and {len(refused) - 20} more" if len(refused) > 20 else ""
        raise InvalidRequest(
            f"{len(refused)} instance(s) are quarantined by list {name!r}: {detail}{more}",
            field="quarantine",
            instances=refused,
        )
