"""Environment validation on the wire: what `raas validate` found and the quarantine list it wrote.

An instance is validated by grading its gold solution and its null action (no change, no
answer) `k` times each through EVAL's own code path. It is sound when the gold solution always
scores full reward and the null action always scores 0; otherwise it is listed with its
problems and quarantined:

| problem | meaning |
| --- | --- |
| `gold_fails` | the gold solution scored below 1 at least once |
| `null_passes` | doing nothing scored above 0 at least once |
| `flaky` | the same action scored differently across the k runs |
| `error` | grading raised (the gold patch does not apply, the repo is missing, ...) |
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from raas_client.models import Answer

Problem = Literal["gold_fails", "null_passes", "flaky", "error"]
ValidationStatus = Literal["pending", "running", "done", "failed"]


class InstanceValidation(Answer):
    """One instance's k gold and k null grades, and what is wrong with them."""

    instance_id: str = Field(description="The instance's id")
    gold_rewards: list[float] = Field(default_factory=list, description="Reward of each gold run")
    null_rewards: list[float] = Field(default_factory=list, description="Reward of each null run")
    problems: list[Problem] = Field(default_factory=list, description="Empty: sound; else why it is quarantined")
    errors: list[str] = Field(default_factory=list, description="Grading errors, one line each")
    seconds: float = Field(0.0, description="Wall seconds spent grading this instance")

    @property
    def sound(self) -> bool:
        """True when the gold solution always passes and the null action never does."""
        return not self.problems


class ValidationView(Answer):
    """A validation run: its status and, once done, every instance's result."""

    validation_id: str = Field(description="The validation's id")
    name: str | None = Field(None, description="The quarantine list it writes (None: report only)")
    agent: str = Field(description="Handler whose EVAL graded")
    k: int = Field(description="Grades per action per instance")
    status: ValidationStatus = Field(description="pending, running, done or failed")
    instances: list[InstanceValidation] = Field(default_factory=list, description="Per-instance results")
    quarantined: list[str] = Field(default_factory=list, description="Ids of the instances with a problem")
    seconds: float | None = Field(None, description="Wall seconds of the whole run")
    error: str | None = Field(None, description="Why a failed run failed")
    created_at: datetime | None = Field(None, description="When it was requested")
    finished_at: datetime | None = Field(None, description="When it ended")

    def problems(self) -> dict[str, list[str]]:
        """{instance_id: problems} of the quarantined instances."""
        return {i.instance_id: list(i.problems) for i in self.instances if i.problems}


class QuarantineView(Answer):
    """A named quarantine list: jobs naming it (`quarantine`) are refused for these instances."""

    name: str = Field(description="The list's name, unique per owner")
    instance_ids: list[str] = Field(default_factory=list, description="Quarantined instance ids")
    reasons: dict[str, Any] = Field(default_factory=dict, description="{instance_id: problems}")
    validation_id: str | None = Field(None, description="The validation that wrote it, if any")
    updated_at: datetime | None = Field(None, description="Last written")
