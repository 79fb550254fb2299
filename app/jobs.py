"""Job service: accept a submission, report progress, page results, cancel, pause and resume.

A submission is validated completely (agent, handler config, every instance, llm spec) before
anything is written; rows are committed first and only then enqueued, so an accepted rollout
exists in the database even if the broker is down (the reaper publishes it later).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from agents.job_config import JobConfig
from agents.llm.spec import LLMSpec
from agents.registry import get_handler
from app.idempotency import replay, request_digest
from app.schemas import (
    AttemptView,
    GroupView,
    JobAccepted,
    JobCreate,
    JobView,
    RolloutView,
    Timing,
    TurnView,
)
from core.db import session_scope
from core.errors import Conflict, InvalidRequest, NotFound, validation_error
from core.models import TERMINAL_VALUES, Job, Rollout, Turn, new_id
from core.policy import (
    DEFAULT_OWNER,
    check_callback_url,
    check_python_env,
    check_sandbox_options,
)
from core.settings import Settings
from tasks.writes import cancels, groups, lifecycle, pauses
from tasks.broker import outbox, purge
from tasks import quotas
from tasks.llm.llm_pool import registered_urls
from tasks.writes.records import wire_fields

log = logging.getLogger(__name__)


def validate_submission(
    settings: Settings,
    req: JobCreate,
    owner: str = DEFAULT_OWNER,
    admin: bool = True,
    labels: dict[str, str] | None = None,
) -> JobConfig:
    """Check the handler-specific parts of a job and return the config stored with it."""
    from pydantic import ValidationError

    handler = get_handler(req.agent)
    if req.quarantine is not None:  # issue 37: instances `raas validate` found broken
        from app.validations import check_quarantine

        check_quarantine(settings, owner, req.quarantine, [i.instance_id for i in req.instances])
    try:
        agent_config = handler.load_config(req.agent_config, settings)
    except ValidationError as exc:
        err = validation_error(exc)
        raise InvalidRequest(f"agent_config.{err.message}", field=f"agent_config.{err.details.get('field')}") from exc
    handler.check_policy(agent_config, settings.policy, admin)
    for i, inst in enumerate(req.instances):
        try:
            handler.check_instance(agent_config, inst.data)
        except InvalidRequest as exc:
            raise InvalidRequest(f"instances[{i}] ({inst.instance_id}): {exc.message}", **exc.details) from exc
    check_sandbox_options(settings.policy.sandbox, req.sandbox)
    if req.sandbox.group_fork and not handler.forkable_init:  # its INIT may differ per sample
        raise InvalidRequest(f"agent {req.agent!r} does not declare its INIT forkable", field="sandbox.group_fork")
    if getattr(agent_config, "python_env", None) is not None:  # handlers ask for it by name
        check_python_env(settings.policy.sandbox, agent_config.python_env, "agent_config.python_env")
    llm = None
    if handler.needs_llm:  # no spec = the registered server pool, tokenizer from the servers
        from agents.llm.backends.guard import url_guard
        from agents.llm.spec import resolve_llm_spec

        with url_guard(None if admin else settings.policy.llm.server_rules):
            llm = resolve_llm_spec(  # parsed once, with the request: typed from here on
                req.llm or LLMSpec(),
                partial(registered_urls, settings.db_url, owner),
                settings.policy.llm,
                admin,
                owner,  # an owner's inline templates are checked one at a time
            )
            _check_prompts_fit(settings, handler, agent_config, req, llm, owner)
    elif req.llm is not None:  # unused by the handler: stored, but held to the same rules
        from agents.llm.spec import check_llm_policy

        llm = check_llm_policy(req.llm.model_copy(deep=True), settings.policy.llm, admin)
    if req.callback_url is not None:
        check_callback_url(settings.policy, req.callback_url, admin, "callback_url")
    return JobConfig(
        sampling=req.sampling,
        limits=req.limits,
        sandbox=req.sandbox,
        resume=req.resume,
        llm=llm,
        agent_config=agent_config.model_dump(),
        labels=labels or {},
        quarantine=req.quarantine,
        health=req.health,
    )


def _check_prompts_fit(
    settings: Settings, handler: Any, agent_config: Any, req: JobCreate, llm: LLMSpec, owner: str
) -> None:
    """Reject an instance whose prompt cannot fit the context, when that is knowable now."""
    from agents.llm.pool import candidate_urls
    from agents.prompt_fit import check_prompts_fit

    urls = candidate_urls(llm, partial(registered_urls, settings.db_url, owner))
    check_prompts_fit(handler, agent_config, [(i.instance_id, i.data) for i in req.instances], llm, urls)


def create_job(
    settings: Settings,
    req: JobCreate,
    owner: str,
    celery: Any,
    labels: dict[str, str] | None = None,
    admin: bool = True,
) -> JobAccepted:
    """Persist a job and its rollouts in one transaction and answer; idempotent on the key.

    The rollouts are committed with their outbox mark and published after the answer by the
    gateway's outbox thread (or, if the gateway dies first, by the reaper): a large job costs
    the request one bulk insert, never a broker round trip per rollout. `labels` are kept in
    the job's config (e.g. the ProRL job id /cancel looks up); `admin` callers may name any
    LLM server URL (tenants only allowlisted ones). A repeated idempotency key answers the
    first job (same ids, same order) or a 409 when the body differs (`app.idempotency`).
    """
    existing = replay(settings, owner, req)
    if existing is not None:
        return existing
    per_instance = req.n_samples + req.spare
    n = quotas.check_job_size(settings, len(req.instances), per_instance)
    config = validate_submission(settings, req, owner, admin, labels).dump()
    cuts = req.spare > 0 or req.group_timeout is not None
    job = Job(
        owner=owner,
        agent=req.agent,
        config=config,
        idempotency_key=req.idempotency_key,
        request_digest=request_digest(req) if req.idempotency_key else None,
        n_instances=len(req.instances),
        n_samples=per_instance,
        group_size=req.n_samples if cuts else None,
        priority=req.priority,
        callback_url=req.callback_url,
    )
    now = lifecycle.utcnow()
    rows = [
        {
            "id": new_id(),
            "instance_id": inst.instance_id,
            "instance": inst.data,
            "sample_index": k,
            "queued_at": now,
            "created_at": now,
            "outbox_at": now,
        }
        for inst in req.instances
        for k in range(per_instance)
    ]
    try:
        with session_scope(settings.db_url) as s:
            quotas.reserve_in_flight(s, settings, owner, n)
            s.add(job)
            s.flush()
            for row in rows:
                row["job_id"] = job.id
            s.execute(insert(Rollout), rows)  # Core bulk insert: one round trip per batch
            if cuts:
                groups.create_rows(s, job.id, [i.instance_id for i in req.instances], req.n_samples, req.group_timeout)
    except IntegrityError:  # a concurrent submission with the same key committed first
        existing = replay(settings, owner, req)
        if existing is None:
            raise
        return existing
    ids = [row["id"] for row in rows]
    celery.raas_parts.get(outbox.OutboxPublisher).submit(ids)  # the gateway's (`app.factory`)
    return JobAccepted.build(job_id=job.id, rollout_ids=ids, created=True)


def get_job(s: Session, job_id: str, owner: str | None = None) -> Job:
    """The job or NotFound."""
    job = s.get(Job, job_id)
    if job is None or (owner is not None and job.owner != owner):
        raise NotFound(f"job {job_id!r} not found")
    return job


def owner_jobs(s: Session, owner: str, before: str | None, limit: int, prefix: str | None = None) -> list[JobView]:
    """One page of the owner's jobs, newest first, after the job id `before` (a cursor);
    `prefix` keeps the ids that start with it (the short ids the dashboard shows)."""
    q = select(Job).where(Job.owner == owner)
    if prefix:
        q = q.where(Job.id.startswith(prefix, autoescape=True))
    if before:
        pivot = get_job(s, before, owner)
        q = q.where((Job.created_at < pivot.created_at) | ((Job.created_at == pivot.created_at) & (Job.id < pivot.id)))
    jobs = s.scalars(q.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit)).all()
    return [job_view(s, j) for j in jobs]


def job_view(s: Session, job: Job) -> JobView:
    """A job with counts per status and outcome."""
    counts = dict(
        s.execute(select(Rollout.status, func.count()).where(Rollout.job_id == job.id).group_by(Rollout.status)).all()
    )
    outcomes = dict(
        s.execute(
            select(Rollout.outcome, func.count())
            .where(Rollout.job_id == job.id, Rollout.status.in_(TERMINAL_VALUES))
            .group_by(Rollout.outcome)
        ).all()
    )
    total = job.n_rollouts
    finished = sum(counts.get(v, 0) for v in TERMINAL_VALUES)
    if finished >= total:
        status = "cancelled" if job.cancel_requested else "done"
    elif job.cancel_requested:
        status = "cancelling"
    else:
        status = "paused" if job.paused_at is not None else "running"
    size = job.group_size or job.n_samples
    return JobView.build(
        job_id=job.id,
        agent=job.agent,
        status=status,
        n_instances=job.n_instances,
        n_samples=size,
        spare=job.n_samples - size,
        priority=job.priority or 0,
        callback_url=job.callback_url,
        n_rollouts=total,
        finished=finished,
        progress=round(finished / total, 4) if total else 1.0,
        counts=counts,
        outcomes={k or "none": v for k, v in outcomes.items()},
        created_at=job.created_at,
        finished_at=job.finished_at,
        idempotency_key=job.idempotency_key,
        paused_at=job.paused_at,
        pause_reason=job.pause_reason,
    )


def rollout_view(r: Rollout, turns: list[Turn] | None = None, group: dict[str, Any] | None = None) -> RolloutView:
    """The wire form of a rollout (`raas_client.models.RolloutView`: the record and the row's
    identity, status and timing); given its turns, they are grouped by attempt."""
    current, earlier = None, None
    if turns is not None:
        current = [TurnView.model_validate(t) for t in turns if t.attempt == r.attempt]
        earlier = [
            AttemptView.build(
                attempt=h.get("attempt", 0),
                error=h.get("error"),
                ended_at=h.get("ended_at"),
                turns=[TurnView.model_validate(t) for t in turns if t.attempt == h.get("attempt")],
            )
            for h in (r.attempt_history or [])
        ]
    return RolloutView.build(
        **wire_fields(r),  # the record's part: the columns named like its fields, less pipeline keys
        rollout_id=r.id,
        job_id=r.job_id,
        instance_id=r.instance_id,
        sample_index=r.sample_index,
        status=r.status,
        error=r.error,
        attempt=r.attempt,
        node=r.node,
        reward=r.reward,
        timing=Timing.build(init=r.init_seconds, run=r.run_seconds, eval=r.eval_seconds),
        seq=r.result_seq,
        group_complete=r.completes_group,
        cut_reason=r.cut_reason,
        group=GroupView.model_validate(group) if group is not None else None,
        created_at=r.created_at,
        finished_at=r.finished_at,
        parent_rollout_id=r.parent_rollout_id,
        branch_turn=r.branch_turn,
        turns=current,
        earlier_attempts=earlier,
    )


def results_after(s: Session, job_id: str, after: int, limit: int) -> list[RolloutView]:
    """Finished rollouts of a job after cursor `after`, in completion order."""
    rows = s.scalars(
        select(Rollout)
        .where(Rollout.job_id == job_id, Rollout.result_seq > after)
        .order_by(Rollout.result_seq)
        .limit(limit)
    ).all()
    closers = [r.instance_id for r in rows if r.completes_group]
    records = groups.records(s, job_id, closers) if closers else {}
    return [rollout_view(r, group=records.get(r.instance_id) if r.completes_group else None) for r in rows]


def pause_job(settings: Settings, job_id: str, owner: str | None = None, celery: Any = None) -> JobView:
    """Pause a job (`tasks.writes.pauses`): its queued rollouts wait unclaimed, started ones
    finish. Pausing a finished or cancelled job is refused; pausing a paused one changes nothing."""
    with session_scope(settings.db_url) as s:
        job = get_job(s, job_id, owner)
        if job.cancel_requested or job.finished_at is not None:
            raise Conflict(f"job {job_id!r} is {'cancelled' if job.cancel_requested else 'finished'}: nothing to pause")
    if pauses.pause_job(settings.db_url, job_id, f"paused by {owner or 'an operator'}") and celery is not None:
        purge.purge_quietly(celery, job_id)
    with session_scope(settings.db_url) as s:
        return job_view(s, get_job(s, job_id))


def resume_job(settings: Settings, job_id: str, owner: str | None = None, celery: Any = None) -> JobView:
    """Resume a paused job: its parked rollouts are published again through the outbox.
    Resuming a job that is not paused changes nothing."""
    with session_scope(settings.db_url) as s:
        get_job(s, job_id, owner)
    ids = pauses.resume_job(settings.db_url, job_id)
    if ids and celery is not None:
        celery.raas_parts.get(outbox.OutboxPublisher).submit(ids)
    with session_scope(settings.db_url) as s:
        return job_view(s, get_job(s, job_id))


def cancel_job(settings: Settings, job_id: str, owner: str | None = None, celery: Any = None) -> JobView:
    """Stop a job: queued rollouts end at once (one statement), running ones at their next
    turn; then their INIT messages leave the broker (`tasks.broker.purge`), so the next job does not
    wait behind them. A purge that fails changes nothing: the workers drop those messages."""
    with session_scope(settings.db_url) as s:
        get_job(s, job_id, owner)
    cancels.cancel_job(settings.db_url, job_id)
    if celery is not None:
        purge.purge_quietly(celery, job_id)
    with session_scope(settings.db_url) as s:
        return job_view(s, get_job(s, job_id))
