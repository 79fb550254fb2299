"""v1 validations: grade a data set's gold solutions and null actions; read quarantine lists."""

from __future__ import annotations

from flask import Blueprint, current_app, g
from raas_client.validation_models import QuarantineView, ValidationView

from app.api.routing import typed_route
from app.context import gateway_settings
from app.validations import ValidationCreate, create_validation, get_validation, publish, quarantine, view
from core.db import session_scope
from core.errors import NotFound

bp = Blueprint("validations", __name__)


@typed_route(
    bp,
    "/v1/validations",
    "POST",
    body=ValidationCreate,
    response=ValidationView,
    status=202,
    summary="Validate a data set: gold and null actions graded k times by EVAL; writes a quarantine list",
)
def submit(body: ValidationCreate) -> ValidationView:
    settings = gateway_settings()
    validation_id = create_validation(settings, body, g.owner)
    publish(current_app.extensions["celery"], validation_id)
    with session_scope(settings.db_url) as s:
        return view(get_validation(s, validation_id, g.owner))


@typed_route(bp, "/v1/validations/<validation_id>", "GET", response=ValidationView, summary="A validation's report")
def show(validation_id: str) -> ValidationView:
    with session_scope(gateway_settings().db_url) as s:
        return view(get_validation(s, validation_id, g.owner))


@typed_route(bp, "/v1/quarantine/<name>", "GET", response=QuarantineView, summary="A quarantine list by name")
def show_quarantine(name: str) -> QuarantineView:
    with session_scope(gateway_settings().db_url) as s:
        listed = quarantine(s, g.owner, name)
    if listed is None:
        raise NotFound(f"quarantine list {name!r} not found")
    return listed
