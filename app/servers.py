"""LLM-server service: register, list, update, remove and clear an owner's inference servers
(shared by the v1, weights and ProRL blueprints, so none of them writes SQL or imports another).

A tenant's pool is its own rows. A non-admin may register only URLs the operator allows
(`policy.llm.server_urls`) and only credentials the operator registered for that URL; the
operator (admin) may register any URL.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.schemas import LLMServerCreate, LLMServerView
from core.db import session_scope
from core.errors import Conflict, NotFound
from core.models import LLMServer
from core.policy import LLMPolicy, check_credential, check_server_url


def register_server(db_url: str, body: LLMServerCreate, owner: str, admin: bool, policy: LLMPolicy) -> LLMServerView:
    """Add a server to `owner`'s pool; a URL outside the policy is a 400, a duplicate a 409.

    A server added while the owner's pool is paused (a weight push under way, or one that
    failed and left the pool paused) joins paused: the pause is pool-wide, and a rollout waiting
    on it must not slip onto the newcomer's weights before the push or resume decides them."""
    check_server_url(policy, body.url, admin, "url")
    if body.credential is not None:
        check_credential(policy, body.credential, body.url, "credential")
    try:
        with session_scope(db_url) as s:
            pool_paused = s.scalar(select(LLMServer.id).where(LLMServer.owner == owner, LLMServer.paused).limit(1))
            server = LLMServer(
                owner=owner,
                paused=pool_paused is not None,
                url=body.url,
                model=body.model,
                weight_version=body.weight_version,
                backend=body.backend,
                logprobs_mode=body.logprobs_mode,
                credential=body.credential,
            )
            s.add(server)
            s.flush()
            return LLMServerView.model_validate(server)
    except IntegrityError:
        raise Conflict(f"llm server {body.url!r} is already registered", field="url") from None


def clear_servers(db_url: str, owner: str) -> int:
    """Remove every server of `owner`; returns how many. (To swap weights, pause instead.)"""
    with session_scope(db_url) as s:
        servers = s.scalars(select(LLMServer).where(LLMServer.owner == owner)).all()
        for server in servers:
            s.delete(server)
        return len(servers)


def _own_server(s: Session, server_id: str, owner: str) -> LLMServer:
    """The owner's server, or NotFound (another owner's id answers the same)."""
    server = s.get(LLMServer, server_id)
    if server is None or server.owner != owner:
        raise NotFound(f"llm server {server_id!r} not found")
    return server


def owner_servers(db_url: str, owner: str) -> list[LLMServerView]:
    """The owner's servers, oldest first."""
    with session_scope(db_url) as s:
        rows = s.scalars(select(LLMServer).where(LLMServer.owner == owner).order_by(LLMServer.created_at)).all()
        return [LLMServerView.model_validate(r) for r in rows]


def servers_by_id(db_url: str, ids: Iterable[str]) -> list[LLMServer]:
    """The servers with these ids, oldest first (read after the caller checked them)."""
    with session_scope(db_url) as s:
        return list(
            s.scalars(select(LLMServer).where(LLMServer.id.in_(list(ids))).order_by(LLMServer.created_at)).all()
        )


def update_server(db_url: str, server_id: str, owner: str, changes: dict[str, Any]) -> LLMServerView:
    """Set fields of one of the owner's servers (paused, weight_version, ...)."""
    with session_scope(db_url) as s:
        server = _own_server(s, server_id, owner)
        for key, value in changes.items():
            setattr(server, key, value)
        s.flush()
        return LLMServerView.model_validate(server)


def delete_server(db_url: str, server_id: str, owner: str) -> None:
    """Remove one of the owner's servers."""
    with session_scope(db_url) as s:
        s.delete(_own_server(s, server_id, owner))
