"""v1 llm-servers: each owner's inference servers, registered, paused and updated.

Weight updates without restarts: `PUT {"paused": true}` (no new generation goes to the server;
rollouts that use it wait, they do not fail), load the weights, then
`PUT {"paused": false, "weight_version": "<new>"}`. Every turn records the version it was
sampled with; see docs/weights.md. Servers belong to the caller's owner:
another owner's server ids answer 404 (registration rules: `app.servers`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from flask import Blueprint, g, request

from app.api.routing import typed_route
from app.context import gateway_settings
from app.schemas import LLMServerCreate, LLMServerList, LLMServerUpdate, LLMServerView, LLMServerDeleted
from app.servers import delete_server, owner_servers, register_server, update_server

bp = Blueprint("llm_servers", __name__)


def _db() -> str:
    return gateway_settings().db_url


@typed_route(
    bp,
    "/v1/llm-servers",
    "POST",
    body=LLMServerCreate,
    response=LLMServerView,
    status=201,
    summary="Register an inference server in the caller's pool",
)
def create(body: LLMServerCreate) -> LLMServerView:
    return register_server(_db(), body, g.owner, g.admin, gateway_settings().policy.llm)


@typed_route(
    bp,
    "/v1/llm-servers",
    "GET",
    response=LLMServerList,
    summary="List the caller's inference servers",
    query={"probe": "1: ask each server's GET /v1/models now (reachable, probe_error)"},
)
def index() -> LLMServerList:
    views = owner_servers(_db(), g.owner)
    if request.args.get("probe") == "1" and views:
        _probe(views)
    return LLMServerList(servers=views)


def _probe(views: list[LLMServerView]) -> None:
    """Ask every server at once whether it answers (the stored `healthy` only changes when a
    rollout's request fails, so a server down since registration would look healthy).

    The guard is per thread, so each executor thread enters it itself: a tenant's URL is held
    to today's rules and pinned to a resolved address (a name re-pointed since registration,
    or rules tightened since, must not make the gateway call and reflect an internal address).
    """
    from agents.llm.backends.guard import url_guard
    from agents.llm.tokenizer import model_names, probe_models

    rules = None if g.admin else gateway_settings().policy.llm.server_rules

    def guarded(url: str):
        with url_guard(rules):
            return probe_models(url)

    with ThreadPoolExecutor(max_workers=min(16, len(views))) as pool:
        answers = list(pool.map(guarded, [v.url for v in views]))
    for view, (entries, error) in zip(views, answers):
        view.reachable, view.probe_error = error is None, error
        view.served_models = model_names(entries) if error is None else None


@typed_route(
    bp,
    "/v1/llm-servers/<server_id>",
    "PUT",
    body=LLMServerUpdate,
    response=LLMServerView,
    summary="Update a server: pause/resume it, set its new weight version",
)
def update(server_id: str, body: LLMServerUpdate) -> LLMServerView:
    return update_server(_db(), server_id, g.owner, body.model_dump(exclude_unset=True))


@typed_route(bp, "/v1/llm-servers/<server_id>", "DELETE", response=LLMServerDeleted, summary="Remove a server")
def delete(server_id: str) -> LLMServerDeleted:
    delete_server(_db(), server_id, g.owner)
    return LLMServerDeleted.build(deleted=server_id)
