"""The OpenAPI document, generated from the typed routes' pydantic models."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from app.api.routing import ROUTES
from app.schemas import ErrorBody

REF = "#/components/schemas/{model}"


def build_openapi(version: str = "0.1.0") -> dict[str, Any]:
    """OpenAPI 3.1 for every route registered through `typed_route`."""
    models: set[type[BaseModel]] = {ErrorBody}
    for r in ROUTES:
        models.update(m for m in (r.body, r.response) if m is not None)
    keyed = [(m, mode) for m in sorted(models, key=lambda m: m.__name__) for mode in ("validation", "serialization")]
    refs, defs = models_json_schema(keyed, ref_template=REF)
    paths: dict[str, Any] = {}
    for r in ROUTES:
        op: dict[str, Any] = {
            "summary": r.summary,
            "tags": [r.tag],
            "responses": {
                str(r.status): _content(refs[(r.response, "serialization")]) if r.response else {"description": "OK"},
                "4XX": _content({"$ref": REF.format(model="ErrorBody")}),
            },
        }
        if r.body is not None:
            op["requestBody"] = {"required": True, **_content(refs[(r.body, "validation")])}
        params = [
            {"name": p.strip("{}"), "in": "path", "required": True, "schema": {"type": "string"}}
            for p in r.path.split("/")
            if p.startswith("{")
        ]
        params += [
            {"name": k, "in": "query", "required": False, "description": v, "schema": {"type": "string"}}
            for k, v in r.query.items()
        ]
        if params:
            op["parameters"] = params
        paths.setdefault(r.path, {})[r.method] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "raas", "version": version},
        "paths": paths,
        "components": {"schemas": defs.get("$defs", {})},
    }


def _content(schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": "JSON", "content": {"application/json": {"schema": schema}}}
