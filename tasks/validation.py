"""Environment validation: grade each instance's gold solution and null action k times.

Before GPUs are spent on a data set, every instance should reward its gold solution (swe: the
gold patch; code: the reference solution; math: the answer) with 1 and the null action (no
change, no answer) with 0, the same way every time. This module grades both through EVAL's one
code path, `tasks.sandboxing.grading.grade` (the one the EVAL stage and re-evaluation call: a fresh
grading sandbox filled by the handler's `prepare_eval`, or host-side grading), on artifacts
shaped as RUN stores them (`agents.gold`). Nothing here grades on its own.

It runs as the `raas.validate` task on the shared `init` queue (any node can start a grading
sandbox; `POST /v1/validations`), or in the calling process (`raas validate`): both call
`run_validation` on a `validations` row, which records the per-instance results and, when the
run has a name, becomes that owner's quarantine list (`app.quarantine`).
"""

from __future__ import annotations

import logging
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from itertools import count
from typing import Any

from celery import shared_task
from raas_client.models import Trajectory
from raas_client.validation_models import InstanceValidation

from agents import gold
from agents.abstract import AgentHandler
from agents.contexts import RolloutContext
from agents.job_config import JobConfig
from agents.registry import get_handler
from core.db import session_scope
from core.models import Validation, utcnow
from core.settings import Settings
from tasks.sandboxing import grading

log = logging.getLogger(__name__)

VALIDATE_TASK = "raas.validate"
FULL_REWARD = 1.0 - 1e-9  # the gold solution must earn the whole reward


class _Run:
    """One validation's fixed parts: the handler, its loaded config, a label counter."""

    def __init__(self, settings: Settings, validation_id: str, agent: str, config: JobConfig) -> None:
        from sandbox.handles import state_root
        from tasks.sandboxing.sandboxes import sandbox_settings

        self.settings, self.validation_id, self.config = settings, validation_id, config
        self.agent = agent
        self.handler: AgentHandler = get_handler(agent)
        self.agent_config = self.handler.load_config(config.agent_config, settings)
        # Grading sandboxes live in their own state dir, away from the node reaper's sweep
        # (it stops sandboxes of no live rollout attempt), as re-evaluation's do.
        self.state_dir = str(state_root(sandbox_settings(settings).state_dir) / "validate")
        self._labels = count(1)

    def grade(self, instance_id: str, instance: dict[str, Any], artifact: dict[str, Any], run: str) -> float:
        """The reward EVAL gives `artifact` on `instance` (a fresh context per grade); `run`
        names the grade's workspace (`<action>-<i>`)."""
        n = next(self._labels)
        base = RolloutContext(
            rollout_id=f"validate-{self.validation_id}-{n}",
            job_id=self.validation_id,
            instance_id=instance_id,
            instance=instance,
            sample_index=n,
            attempt=1,
            agent_config=self.agent_config,
            job_config=self.config,
            settings=self.settings,
            deadline=time.monotonic() + self.config.limits.eval_timeout,
            state={},
            logger=log,
        )
        result = grading.grade(
            self.settings,
            self.handler,
            base.for_eval(Trajectory.build(), artifact),
            job_sandbox=self.config.sandbox,
            label=(f"validate-{self.validation_id}", n),
            workspace=self.settings.workspaces / f"validate-{self.validation_id}-{n}-{run}",
            state_dir=self.state_dir,
        )
        return float(result.reward)

    def instance(self, instance_id: str, instance: dict[str, Any], k: int) -> InstanceValidation:
        """Grade gold and null k times each; name what is wrong."""
        started = time.monotonic()
        out = InstanceValidation(instance_id=instance_id)
        try:
            self.handler.check_instance(self.agent_config, instance)
            for action in gold.ACTIONS:
                artifact = gold.artifact(self.agent, action, instance, self.settings)
                if artifact.get("gold_error"):
                    out.errors.append(str(artifact.pop("gold_error")))
                rewards = [self.grade(instance_id, instance, artifact, f"{action}-{i}") for i in range(k)]
                setattr(out, f"{action}_rewards", rewards)
        except Exception as exc:  # noqa: BLE001 - a broken instance is a finding, not a crash
            log.warning("validation %s: %s could not be graded: %s", self.validation_id, instance_id, exc)
            out.errors.append("".join(traceback.format_exception_only(type(exc), exc)).strip()[:1000])
        out.problems = problems_of(out)
        out.seconds = round(time.monotonic() - started, 3)
        return out


def problems_of(result: InstanceValidation) -> list[str]:
    """What is wrong with an instance's grades (empty: sound)."""
    found = ["error"] if result.errors else []
    if any(r < FULL_REWARD for r in result.gold_rewards):
        found.append("gold_fails")
    if any(r > 0 for r in result.null_rewards):
        found.append("null_passes")
    if len(set(result.gold_rewards)) > 1 or len(set(result.null_rewards)) > 1:
        found.append("flaky")
    return found


def validate_instances(
    settings: Settings,
    validation_id: str,
    agent: str,
    config: JobConfig,
    instances: list[tuple[str, dict[str, Any]]],
    k: int,
    parallel: int = 1,
) -> list[InstanceValidation]:
    """Every instance's `InstanceValidation`, in input order (`parallel` instances at a time)."""
    gold.check_agent(agent)
    run = _Run(settings, validation_id, agent, config)
    if parallel <= 1:
        return [run.instance(iid, data, k) for iid, data in instances]
    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="raas-validate") as pool:
        return list(pool.map(lambda item: run.instance(item[0], item[1], k), instances))


def run_validation(settings: Settings, validation_id: str, parallel: int = 1) -> None:
    """Grade a stored validation request and record its report (idempotent once done)."""
    with session_scope(settings.db_url) as s:
        row = s.get(Validation, validation_id)
        if row is None or row.status in ("done", "failed"):
            return
        row.status = "running"
        agent, k, request = row.agent, row.k, dict(row.request)
    started = time.monotonic()
    report: list[InstanceValidation] = []
    error = None
    try:
        config = JobConfig.load(request.get("config"))
        instances = [(i["instance_id"], i["data"]) for i in request.get("instances", [])]
        report = validate_instances(settings, validation_id, agent, config, instances, k, parallel)
    except Exception as exc:
        log.exception("validation %s failed", validation_id)
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    with session_scope(settings.db_url) as s:
        row = s.get(Validation, validation_id)
        row.report = [r.model_dump(mode="json") for r in report]
        row.quarantined = [r.instance_id for r in report if r.problems]
        row.status = "failed" if error else "done"
        row.error = error
        row.seconds = round(time.monotonic() - started, 3)
        row.finished_at = utcnow()


@shared_task(name=VALIDATE_TASK, bind=True)
def validate_task(self, validation_id: str) -> None:
    """`run_validation` on a worker of the `init` queue."""
    run_validation(self.app.raas_settings, validation_id)
