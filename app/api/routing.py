"""Typed routes: pydantic models in, pydantic models out, and an OpenAPI entry for each.

`typed_route` parses the JSON body into the declared model (a bad body is a 400 naming the
field), serialises the returned model, and records the route so `/openapi.json` is generated
from the same models the handlers use.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request
from pydantic import BaseModel, ValidationError

from app.context import gateway_settings
from core.errors import InvalidRequest, validation_error


@dataclass
class RouteDoc:
    """What the OpenAPI document says about one route."""

    method: str
    path: str
    summary: str
    body: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    status: int = 200
    query: dict[str, str] = field(default_factory=dict)
    tag: str = "v1"


ROUTES: list[RouteDoc] = []


def json_depth_error(data: Any, limit: int) -> InvalidRequest | None:
    """A 400 when `data` nests deeper than `limit` (checked without recursion), else None."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return InvalidRequest(f"body: JSON nested deeper than {limit} levels", field="body")
        children = value.values() if isinstance(value, dict) else value
        if isinstance(value, (dict, list)):
            stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return None


def json_body() -> Any:
    """The request's JSON body (None when it is not JSON); nesting deeper than the setting
    `max_json_depth` is a 400 naming `body`, never a RecursionError's 500."""
    if not request.is_json:
        return None
    limit = gateway_settings().max_json_depth
    try:
        data = current_app.json.loads(request.get_data(cache=True))
    except RecursionError:
        raise InvalidRequest(f"body: JSON nested deeper than {limit} levels", field="body") from None
    except ValueError:
        return None
    error = json_depth_error(data, limit)
    if error is not None:
        raise error
    return data


def parse_body(model: type[BaseModel]) -> BaseModel:
    """The request's JSON body as `model`."""
    data = json_body()
    if data is None:
        raise InvalidRequest("request body must be a JSON object", field="body")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from exc


def to_response(value: Any, status: int) -> Response:
    """Serialise a view's return value (model, list of models, dict or Response)."""
    if isinstance(value, Response):
        return value
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    resp = jsonify(value)
    resp.status_code = status
    return resp


def typed_route(
    bp: Blueprint,
    path: str,
    method: str,
    *,
    summary: str,
    body: type[BaseModel] | None = None,
    response: type[BaseModel] | None = None,
    status: int = 200,
    query: dict[str, str] | None = None,
    tag: str = "v1",
) -> Callable:
    """Register a view on `bp` whose body/response are the given models."""
    openapi_path = path.replace("<", "{").replace(">", "}")
    for conv in ("string:", "int:", "path:"):
        openapi_path = openapi_path.replace("{" + conv, "{")
    ROUTES.append(RouteDoc(method.lower(), openapi_path, summary, body, response, status, query or {}, tag))

    def decorator(view: Callable) -> Callable:
        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Response:
            if body is not None:
                kwargs["body"] = parse_body(body)
            return to_response(view(*args, **kwargs), status)

        bp.add_url_rule(path, view_func=wrapper, methods=[method])
        return wrapper

    return decorator


def query_number(name: str, default: float, *, minimum: float, maximum: float, integer: bool = True) -> float:
    """A numeric query parameter within bounds, or a 400 naming it."""
    raw = request.args.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise InvalidRequest(f"query parameter {name!r} must be a number, got {raw!r}", field=name) from None
    if not minimum <= value <= maximum:
        raise InvalidRequest(f"query parameter {name!r} must be in [{minimum}, {maximum}]", field=name)
    return value
