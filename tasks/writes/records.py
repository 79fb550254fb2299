"""The rollout record (`raas_client.models.Trajectory`) and the rollout's columns of that name.

The record is one pydantic type from the LLM layer to the trainer; the SQL model stores each of
its fields in a column named alike (server-only fields, such as the lease, the node and the
handler's state, live only in the SQL model). These functions are the whole mapping; the
pipeline's own keys in `extra` (`tasks.broker.config.PIPELINE_EXTRA_KEYS`) stay on the server.
"""

from __future__ import annotations

from typing import Any

from raas_client.models import TRAJECTORY_FIELDS, Trajectory

from core.models import Outcome
from tasks.broker.config import PIPELINE_EXTRA_KEYS


def record_fields(source: Any) -> dict[str, Any]:
    """The record's fields of `source` (a `Trajectory`, or a rollout row: the columns named
    alike), as keyword arguments for the row's writes or the gateway's `RolloutView`."""
    return {name: getattr(source, name) for name in TRAJECTORY_FIELDS}


def wire_fields(row: Any) -> dict[str, Any]:
    """The record's fields of a rollout row as a trainer receives them (the gateway's
    `RolloutView`): `record_fields` without the pipeline's keys in `extra`."""
    fields = record_fields(row)
    extra = fields["extra"] or {}
    if not PIPELINE_EXTRA_KEYS.isdisjoint(extra):
        fields["extra"] = {k: v for k, v in extra.items() if k not in PIPELINE_EXTRA_KEYS}
    return fields


def stored_record(row: Any) -> Trajectory:
    """What RUN stored on a rollout row, as the record EVAL and re-evaluation grade (a row
    handed to EVAL has an outcome; one from before outcomes were stored counts as completed)."""
    record = Trajectory.model_validate(row, from_attributes=True)
    if record.outcome is None:
        record.outcome = Outcome.COMPLETED.value
    return record
