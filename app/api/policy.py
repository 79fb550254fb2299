"""GET /v1/policy: what a trainer's job spec may ask of this deployment."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, g
from pydantic import BaseModel, Field

from app.api.routing import typed_route
from app.context import gateway_settings

bp = Blueprint("policy", __name__)


class PolicyView(BaseModel):
    """The operator's policy as the caller sees it (credential variables never shown)."""

    owner: str = Field(description="The owner this token speaks for")
    admin: bool = Field(description="Whether this token may use operator routes")
    sandbox: dict[str, Any] = Field(description="Runtimes, network, env allowlist, names, caps")
    llm: dict[str, Any] = Field(description="Allowed server URLs, templates, credential names")


@typed_route(
    bp,
    "/v1/policy",
    "GET",
    response=PolicyView,
    summary="What a job may choose: sandbox runtimes/network/env/limits, LLM servers",
)
def show() -> PolicyView:
    public = gateway_settings().policy.public()
    return PolicyView(owner=g.owner, admin=g.admin, **public)
