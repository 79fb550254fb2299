"""The artifacts an instance's gold solution and its null action would leave, per handler.

Environment validation (`tasks.validation`) grades these through EVAL's one code path
(`tasks.sandboxing.grading.grade`), exactly as it grades what an agent left: so each artifact here has the
shape the handler's own `artifact` hook produces at the end of RUN.

| agent | gold | null |
| --- | --- | --- |
| `swe` | the instance's `patch` applied to a clean checkout, diffed as RUN diffs a workspace | no change |
| `code` | the instance's `reference_solution` as the solution file | no solution file |
| `math` | the instance's `answer` | no answer |
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.errors import InvalidRequest
from core.settings import Settings

ACTIONS = ("gold", "null")


def _swe(instance: dict[str, Any], settings: Settings, gold: bool) -> dict[str, Any]:
    """Two checkouts at the base commit, the gold patch applied to one, diffed as RUN does."""
    from agents.handlers.swe.diff import workspace_changes
    from agents.handlers.swe.repo import materialize

    with tempfile.TemporaryDirectory(prefix="raas-gold-") as scratch:
        clean, agent = Path(scratch, "clean"), Path(scratch, "agent")
        for folder in (clean, agent):
            folder.mkdir()
            materialize(
                instance["repo"], instance["base_commit"], folder, settings.repo_root, settings.repo_mirror_root
            )
        if gold:
            patch = instance.get("patch")
            if not isinstance(patch, str) or not patch.strip():
                raise InvalidRequest("swe instance has no gold `patch` to validate with", field="instance.patch")
            applied = subprocess.run(
                ["git", "apply", "--whitespace=nowarn", "-"], cwd=agent, input=patch, text=True, capture_output=True
            )
            if applied.returncode != 0:  # a gold patch that does not apply is a broken instance
                return {"files": {}, "skipped": {}, "gold_error": f"git apply: {applied.stderr.strip()[:500]}"}
        return workspace_changes(str(agent), str(clean))


def _code(instance: dict[str, Any], settings: Settings, gold: bool) -> dict[str, Any]:
    """The reference solution as the solution file (the code handler's artifact shape)."""
    from agents.handlers.code.handler import solution_file

    if not gold:
        return {"files": {}}
    reference = instance.get("reference_solution")
    if not isinstance(reference, str) or not reference.strip():
        raise InvalidRequest(
            "code instance has no `reference_solution` to validate with", field="instance.reference_solution"
        )
    return {"files": {solution_file(instance): reference}}


def _math(instance: dict[str, Any], settings: Settings, gold: bool) -> dict[str, Any]:
    """The reference answer as the agent's answer (null: no answer at all)."""
    return {"answer": str(instance["answer"])} if gold else {}


BUILDERS: dict[str, Callable[[dict[str, Any], Settings, bool], dict[str, Any]]] = {
    "swe": _swe,
    "code": _code,
    "math": _math,
}


def check_agent(agent: str) -> None:
    """Raise `InvalidRequest` naming the agents that can be validated when `agent` cannot."""
    if agent not in BUILDERS:
        raise InvalidRequest(
            f"agent {agent!r} has no gold solution to validate with (validatable: {', '.join(sorted(BUILDERS))})",
            field="agent",
        )


def artifact(agent: str, action: str, instance: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """The artifact of `action` ("gold" or "null") on `instance` for handler `agent`."""
    check_agent(agent)
    if action not in ACTIONS:
        raise InvalidRequest(f"action must be one of {ACTIONS}", field="action")
    return BUILDERS[agent](instance, settings, action == "gold")
