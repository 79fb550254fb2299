"""v1 llm-servers: the inference servers the trainer registers, pauses and updates.

Weight updates without restarts: `PUT {"paused": true}` (no new generation goes to the server;
rollouts that use it wait, they do not fail), load the weights, then
`PUT {"paused": false, "weight_version": "<new>"}`. Every turn records the version it was
sampled with; see the README's weight-update flow.
"""
from __future__ import annotations

from flask import Blueprint, current_app
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from app.api.routing import typed_route
from app.db import session_scope
from app.errors import Conflict, NotFound
from app.models import LLMServer
from app.schemas import LLMServerCreate, LLMServerList, LLMServerUpdate, LLMServerView

bp = Blueprint("llm_servers", __name__)


def _db() -> str:
    return current_app.config["RAAS"].db_url


def register_server(db_url: str, body: LLMServerCreate) -> LLMServerView:
    """Add a server to the shared pool; a duplicate url is a 409."""
    try:
        with session_scope(db_url) as s:
            server = LLMServer(url=body.url, model=body.model,
                               weight_version=body.weight_version, backend=body.backend,
                               logprobs_mode=body.logprobs_mode)
            s.add(server)
            s.flush()
            return LLMServerView.model_validate(server)
    except IntegrityError:
        raise Conflict(f"llm server {body.url!r} is already registered", field="url") from None


def clear_servers(db_url: str) -> int:
    """Remove every registered server; returns how many. (To swap weights, pause instead.)"""
    with session_scope(db_url) as s:
        servers = s.scalars(select(LLMServer)).all()
        for server in servers:
            s.delete(server)
        return len(servers)


@typed_route(bp, "/v1/llm-servers", "POST", body=LLMServerCreate, response=LLMServerView,
             status=201, summary="Register an inference server")
def create(body: LLMServerCreate) -> LLMServerView:
    return register_server(_db(), body)


@typed_route(bp, "/v1/llm-servers", "GET", response=LLMServerList,
             summary="List registered inference servers")
def index() -> LLMServerList:
    with session_scope(_db()) as s:
        rows = s.scalars(select(LLMServer).order_by(LLMServer.created_at)).all()
        return LLMServerList(servers=[LLMServerView.model_validate(r) for r in rows])


@typed_route(bp, "/v1/llm-servers/<server_id>", "PUT", body=LLMServerUpdate,
             response=LLMServerView,
             summary="Update a server: pause/resume it, set its new weight version")
def update(server_id: str, body: LLMServerUpdate) -> LLMServerView:
    with session_scope(_db()) as s:
        server = s.get(LLMServer, server_id)
        if server is None:
            raise NotFound(f"llm server {server_id!r} not found")
        for key, value in body.model_dump(exclude_unset=True).items():
            setattr(server, key, value)
        s.flush()
        return LLMServerView.model_validate(server)


@typed_route(bp, "/v1/llm-servers/<server_id>", "DELETE", summary="Remove a server")
def delete(server_id: str) -> dict:
    with session_scope(_db()) as s:
        server = s.get(LLMServer, server_id)
        if server is None:
            raise NotFound(f"llm server {server_id!r} not found")
        s.delete(server)
    return {"deleted": server_id}
