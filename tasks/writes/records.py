"""The rollout record (`raas_client.models.Trajectory`) and the rollout's columns of that name.

The record is one pydantic type from the LLM layer to the trainer; the SQL model stores each of
its fields in a column named alike (server-only fields, such as the lease, the node and the
handler's state, live only in the SQL model). These two functions are the whole mapping.
"""

from __future__ import annotations

from typing import Any

from raas_client.models import TRAJECTORY_FIELDS, Trajectory

from core.models import Outcome


def record_fields(source: Any) -> dict[str, Any]:
    """The record's fields of `source` (a `Trajectory`, or a rollout row: the columns named
    alike), as keyword arguments for the row's writes or the gateway's `Rollout`."""
    return {name: getattr(source, name) for name in TRAJECTORY_FIELDS}


def stored_record(row: Any) -> Trajectory:
    """What RUN stored on a rollout row, as the record EVAL and re-evaluation grade (a row
    handed to EVAL has an outcome; one from before outcomes were stored counts as completed)."""
    record = Trajectory.model_validate(row, from_attributes=True)
    if record.outcome is None:
        record.outcome = Outcome.COMPLETED.value
    return record
