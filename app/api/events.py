"""Push for trainers: a job's server-sent event stream, its group records, the callback secret.

`GET /v1/jobs/<id>/events` is an SSE stream read from the results order itself, so it costs
the pipeline no write: each finished rollout is an event whose id is its place in the job's
completion order (`seq`); a rollout that closes its group is followed by a `group` event, and
the job's last one by `job`. A client that reconnects with `Last-Event-ID: <seq>` (browsers'
EventSource does it by itself) resumes right after it, and the `group`/`job` events of that
seq come again (they share its id), so nothing is missed. Comments (`: keep-alive`) keep idle
proxies from closing the stream.

Health alerts (`tasks.watch.health_alerts`: judged by the reaper's pass, and here as the stream's
rollouts arrive) are `alert` events carrying the id of the last rollout sent before them (an
alert never moves the resume point). A
(re)connection first sends the job's alerts still active and those raised at or after its
resume point, then each new one.
"""

from __future__ import annotations

import time

from flask import Blueprint, Response, g, request, stream_with_context
from pydantic import BaseModel
from raas_client.event_models import CallbackSecret, RolloutEvent

from app.api.routing import query_number, typed_route
from app.context import POLL_SECONDS, gateway_settings
from app.jobs import get_job, job_view, results_after
from app.schemas import GroupList, GroupView, RolloutView
from core.db import session_scope
from core.errors import InvalidRequest
from tasks.writes import groups
from tasks.writes.callbacks import owner_secret
from app.job_health import app_cache
from tasks.watch.health_alerts import alert_view, check_job, job_alerts

bp = Blueprint("events", __name__)
KEEPALIVE_SECONDS = 15.0


@typed_route(
    bp,
    "/v1/jobs/<job_id>/groups",
    "GET",
    response=GroupList,
    summary="Group records of a job that cuts stragglers (members, cut, reason)",
)
def list_groups(job_id: str) -> GroupList:
    with session_scope(gateway_settings().db_url) as s:
        get_job(s, job_id, g.owner)
        records = groups.records(s, job_id)
    return GroupList(job_id=job_id, groups=[GroupView.model_validate(r) for r in records.values()])


@typed_route(
    bp,
    "/v1/callbacks/secret",
    "GET",
    response=CallbackSecret,
    summary="The secret your job callbacks are signed with (HMAC-SHA256, header X-Raas-Signature)",
)
def callback_secret() -> CallbackSecret:
    return CallbackSecret.build(
        owner=g.owner,
        secret=owner_secret(gateway_settings(), g.owner),
        header="X-Raas-Signature",
        scheme="t=<unix>,v1=hex(hmac_sha256(secret, '<t>.' + body))",
    )


@typed_route(
    bp,
    "/v1/jobs/<job_id>/events",
    "GET",
    summary="Server-sent events of a job's progress (resumable with Last-Event-ID)",
    query={
        "after": "seq to resume after (or the Last-Event-ID header)",
        "wait": "seconds to stay open without news (default 300)",
    },
)
def events(job_id: str) -> Response:
    after = _resume_point()
    wait = query_number("wait", 300, minimum=0, maximum=3600, integer=False)
    with session_scope(gateway_settings().db_url) as s:
        get_job(s, job_id, g.owner)
    resp = Response(stream_with_context(_stream(job_id, after, wait)), mimetype="text/event-stream")
    resp.headers["Cache-Control"] = "no-cache"
    resp.headers["X-Accel-Buffering"] = "no"
    return resp


def _resume_point() -> int:
    raw = request.headers.get("Last-Event-ID") or request.args.get("after") or "0"
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(
            f"Last-Event-ID / after must be a seq number, got {raw!r}", field="Last-Event-ID"
        ) from None
    if value < 0:
        raise InvalidRequest("Last-Event-ID / after must be >= 0", field="Last-Event-ID")
    return value


def _event(kind: str, seq: int, data: BaseModel) -> str:
    return f"id: {seq}\nevent: {kind}\ndata: {data.model_dump_json()}\n\n"


def _stream(job_id: str, after: int, wait: float):
    """Events after `after` until the job is done or `wait` passes without one."""
    yield "retry: 2000\n\n"
    idle_until = time.monotonic() + wait
    last_sent = time.monotonic()
    resumed_at, last_alert, first = after, 0, True
    while True:
        with session_scope(gateway_settings().db_url) as s:
            items = results_after(s, job_id, after, 200)
            view = job_view(s, get_job(s, job_id))
        for item in items:
            yield _event("rollout", item.seq, _rollout_event(item))
            if item.group_complete:
                yield _event("group", item.seq, _group_event(item))
            after = item.seq
        if items or first:  # judged here too: an alert is on the stream with its rollouts
            check_job(gateway_settings().db_url, job_id, app_cache())
        with session_scope(gateway_settings().db_url) as s:
            alerts = job_alerts(s, job_id, last_alert)
        for alert in alerts:
            if alert.seq > after:
                # raised on a rollout committed after this round's read: it goes out next
                # round, after that rollout (an event's id never runs ahead of its rollouts)
                break
            if not first or alert.cleared_at is None or alert.seq >= resumed_at:
                yield _event("alert", after, alert_view(alert))
            last_alert = alert.id
        first = False
        if items or alerts:
            idle_until = last_sent = time.monotonic()
            idle_until += wait
        done = view.finished >= view.n_rollouts and after >= view.finished
        if done:
            yield _event("job", after, view)
            return
        if time.monotonic() >= idle_until:
            return
        if time.monotonic() - last_sent >= KEEPALIVE_SECONDS:
            yield ": keep-alive\n\n"
            last_sent = time.monotonic()
        time.sleep(POLL_SECONDS)


def _rollout_event(item: RolloutView) -> RolloutEvent:
    return RolloutEvent.build(
        seq=item.seq,
        rollout_id=item.rollout_id,
        instance_id=item.instance_id,
        sample_index=item.sample_index,
        status=item.status,
        outcome=item.outcome,
        reward=item.reward,
        cut_reason=item.cut_reason,
        group_complete=item.group_complete,
    )


def _group_event(item: RolloutView) -> GroupView:
    if item.group is not None:
        return item.group
    return GroupView.build(instance_id=item.instance_id, status="complete", closer=item.rollout_id)
