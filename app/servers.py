"""LLM-server service: register and clear an owner's inference servers (shared by the v1
and ProRL blueprints, so neither imports the other).

A tenant's pool is its own rows. A non-admin may register only URLs the operator allows
(`policy.llm.server_urls`) and only credentials the operator registered for that URL; the
operator (admin) may register any URL.
"""
from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from app.schemas import LLMServerCreate, LLMServerView
from core.db import session_scope
from core.errors import Conflict
from core.models import LLMServer
from core.policy import LLMPolicy, check_credential, check_server_url


def register_server(db_url: str, body: LLMServerCreate, owner: str, admin: bool,
                    policy: LLMPolicy) -> LLMServerView:
    """Add a server to `owner`'s pool; a URL outside the policy is a 400, a duplicate a 409."""
    check_server_url(policy, body.url, admin, "url")
    if body.credential is not None:
        check_credential(policy, body.credential, body.url, "credential")
    try:
        with session_scope(db_url) as s:
            server = LLMServer(owner=owner, url=body.url, model=body.model,
                               weight_version=body.weight_version, backend=body.backend,
                               logprobs_mode=body.logprobs_mode, credential=body.credential)
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
