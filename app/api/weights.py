"""v1 pool pause/resume and verified weight pushes for the caller's inference servers.

`POST /v1/llm/pause` pauses every server of the caller's pool (or the ids given) and returns
once no generation is in flight on them; `POST /v1/llm/resume` serves again, optionally with a
new weight version. `POST /v1/weights/push` does both around a verified load (see
`tasks.llm.weights` and docs/weights.md). These calls block for as long as the pause takes.
"""

from __future__ import annotations

import time
from dataclasses import asdict

from flask import Blueprint, current_app, g
from raas_client.weight_models import (
    PausedServerView,
    PoolPause,
    PoolPaused,
    PoolResume,
    PoolResumed,
    ResumedServer,
    WeightPush,
    WeightPushReport,
)

from agents.llm.weights import Fingerprint
from app.api.routing import typed_route
from app.servers import servers_by_id
from tasks.llm import pool_pause, weights

bp = Blueprint("weights", __name__)


def _settings():
    return current_app.config["RAAS"]


@typed_route(
    bp,
    "/v1/llm/pause",
    "POST",
    body=PoolPause,
    response=PoolPaused,
    summary="Pause the caller's pool and wait until no generation is in flight",
)
def pause(body: PoolPause) -> PoolPaused:
    started = time.monotonic()
    servers = pool_pause.pause(_settings().db_url, g.owner, body.servers, body.timeout, _settings().lease_timeout)
    return PoolPaused(
        pause_seconds=round(time.monotonic() - started, 4),
        servers=[
            PausedServerView(
                id=s.id, url=s.url, generating_at_pause=s.generating_at_pause, paused_seconds=s.paused_seconds
            )
            for s in servers
        ],
    )


@typed_route(
    bp,
    "/v1/llm/resume",
    "POST",
    body=PoolResume,
    response=PoolResumed,
    summary="Resume the caller's pool, optionally recording a new weight version",
)
def resume(body: PoolResume) -> PoolResumed:
    ids = pool_pause.resume(_settings().db_url, g.owner, body.servers, body.weight_version)
    rows = servers_by_id(_settings().db_url, ids)
    return PoolResumed(
        servers=[
            ResumedServer(id=r.id, url=r.url, model=r.model, weight_version=r.weight_version, paused=r.paused)
            for r in rows
        ]
    )


@typed_route(
    bp,
    "/v1/weights/push",
    "POST",
    body=WeightPush,
    response=WeightPushReport,
    summary="Load new weights on the pool, verify them against a probe, resume",
)
def push(body: WeightPush) -> WeightPushReport:
    report = weights.push(
        _settings().db_url,
        g.owner,
        version=body.version,
        mechanism=body.mechanism,
        path=body.path,
        probe=Fingerprint(**body.probe.model_dump()),
        tolerance=body.tolerance,
        lora_name=body.lora_name,
        ids=body.servers,
        timeout=body.timeout,
        lease_timeout=_settings().lease_timeout,
    )
    return WeightPushReport.model_validate(asdict(report))
