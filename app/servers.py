"""LLM-server service: register and clear the trainer's inference servers (shared by the v1
and ProRL blueprints, so neither imports the other)."""
from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from app.schemas import LLMServerCreate, LLMServerView
from core.db import session_scope
from core.errors import Conflict
from core.models import LLMServer


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
