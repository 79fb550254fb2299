"""The record is strict where it is built and lenient where it is read: the server builds
`Trajectory` / `RolloutView` with `build` (a misspelt field is an error naming it), the SDK
parses with `model_validate` (a newer server's extra field is ignored); the pipeline's own
keys in `extra` never reach a trainer (`tasks.writes.records.wire_fields`)."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError
from raas_client.models import TRAJECTORY_FIELDS, RolloutView, Trajectory

from tasks.broker.config import PENDING_REEVALUATIONS, PIPELINE_EXTRA_KEYS
from tasks.writes.records import record_fields, wire_fields

ROOT = Path(__file__).resolve().parent.parent
SERVER = ("agents", "tasks", "app", "core")
RECORDS = {"Trajectory", "RolloutView"}


def test_the_server_constructor_refuses_a_misspelt_field_the_sdk_parser_ignores_it() -> None:
    with pytest.raises(ValidationError, match="outcom"):
        Trajectory.build(outcom="completed")
    assert Trajectory.build(outcome="completed").outcome == "completed"
    # what a trainer's SDK does with a field a newer server added: read on, field dropped
    assert Trajectory.model_validate({"outcome": "completed", "a_newer_field": 1}).outcome == "completed"
    row = {
        "rollout_id": "r",
        "job_id": "j",
        "instance_id": "i",
        "sample_index": 0,
        "status": "done",
        "attempt": 1,
        "timing": {},
        "created_at": "2026-01-01T00:00:00Z",
    }
    with pytest.raises(ValidationError, match="rewrad"):
        RolloutView.build(**row, rewrad=1.0)
    assert RolloutView.model_validate({**row, "rewrad": 1.0}).reward is None


def test_server_code_builds_records_only_with_the_strict_constructor() -> None:
    """No product module calls `Trajectory(...)` or `RolloutView(...)` (the lenient form)."""
    lenient = []
    for package in SERVER:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in RECORDS:
                    lenient.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert lenient == []
    built = [
        p
        for package in SERVER
        for p in (ROOT / package).rglob("*.py")
        if "Trajectory.build(" in p.read_text() or "RolloutView.build(" in p.read_text()
    ]
    assert len(built) >= 4  # the LLM layer, the harness, the stages, the gateway


def test_a_trainers_record_carries_no_pipeline_keys() -> None:
    """A done rollout with a re-evaluation pending: the row keeps the request, the wire record
    the gateway builds from it does not."""
    extra = {"turn_boundaries": [[0, 2]], PENDING_REEVALUATIONS: ["req-1"], "reevaluations": []}
    row = SimpleNamespace(**{name: None for name in TRAJECTORY_FIELDS})
    row.extra, row.outcome = extra, "completed"
    assert record_fields(row)["extra"] is extra  # the row's own writes keep it
    shown = wire_fields(row)["extra"]
    assert PIPELINE_EXTRA_KEYS.isdisjoint(shown) and shown == {"turn_boundaries": [[0, 2]], "reevaluations": []}
    assert row.extra[PENDING_REEVALUATIONS] == ["req-1"]  # the row itself is left as it is
