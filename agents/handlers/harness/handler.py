"""The `harness` handler: a registered harness does RUN; the task kind's handler does the rest.

INIT prepares the workspace exactly as the task kind's handler does (swe: the repo at its
base commit; code: nothing but the solution file's name; math: nothing), in a sandbox that
also has a model endpoint folder and the registration's environment, with the network off.
RUN opens the rollout's endpoint (`agents.harness.RolloutEndpoint`) on the sandbox's endpoint
socket, starts the registered command (`launch`) and waits; the trajectory is what the
endpoint captured. The artifact and EVAL are the task handler's (swe: the diff graded with
the test patch in a fresh sandbox; code: the solution file's hidden tests; math: the answer
file checked on the host): the harness never grades itself. A harness that exits non-zero is
`agent_error` (its artifact is still graded: no answer is reward 0) unless the endpoint had
refused it a request or it never got a model call answered (`infra_error`, not graded); a
deadline is the policy's or the infrastructure's by the RUN's time split (`ending`,
`agents.time_split`); a bridge, sandbox or endpoint failure raises and is retried as
infrastructure.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Literal, TypeVar

from pydantic import Field, model_validator

from agents.abstract import AgentHandler, EvalResult, HandlerConfig, Trajectory
from agents.contexts import EvalContext, InitContext, RolloutContext, RunContext
from agents.handlers.harness import ending as endings
from agents.handlers.harness import launch
from agents.registry import get_handler, register
from agents.time_split import TimeSplit
from core.errors import ConfigError, InvalidRequest
from core.harnesses import HarnessRegistration

MAX_ANSWER_BYTES = 64 * 1024
Ctx = TypeVar("Ctx", bound=RolloutContext)


class HarnessConfig(HandlerConfig):
    """A `harness` job's agent_config: which registered harness, on which kind of task."""

    harness: str = Field(description="A harness registered in the operator's policy")
    task: Literal["swe", "math", "code"] = Field(
        description="The task kind: how INIT prepares the workspace and EVAL grades"
    )
    task_config: dict[str, Any] = Field(
        default_factory=dict,
        description="The task handler's config for INIT and EVAL (e.g. "
        "swe `test_timeout`); its prompts and tools are unused",
    )

    @model_validator(mode="after")
    def _task_config(self) -> HarnessConfig:
        get_handler(self.task).Config.model_validate(self.task_config)  # errors name the field
        return self


def _registration(ctx: RolloutContext) -> HarnessRegistration:
    """The node's own registration of the job's harness (its operator's policy decides)."""
    cfg: HarnessConfig = ctx.agent_config  # type: ignore[assignment]
    harness = ctx.settings.policy.harnesses.registered.get(cfg.harness)
    if harness is None:
        raise ConfigError(
            f"harness {cfg.harness!r} is not registered on this node", field="policy.harnesses.registered"
        )
    return harness


@register
class HarnessHandler(AgentHandler):
    """An unmodified harness in the sandbox, graded by the task kind's EVAL."""

    name = "harness"
    Config = HarnessConfig
    replays_calls = True  # a new attempt's harness is answered from the lost one's log

    # -- the task kind's handler does INIT, the artifact and EVAL -------------------------
    @staticmethod
    def _task(ctx: Ctx) -> tuple[AgentHandler, Ctx]:
        """The task handler and a view of `ctx` with its config (state, sandbox shared)."""
        cfg: HarnessConfig = ctx.agent_config  # type: ignore[assignment]
        task = get_handler(cfg.task)
        return task, dataclasses.replace(ctx, agent_config=task.Config.model_validate(cfg.task_config))

    def check_policy(self, config: HandlerConfig, policy: Any, admin: bool) -> None:
        """The harness is registered, open to this caller and fit for the task kind."""
        from core.policy import check_harness

        cfg: HarnessConfig = config  # type: ignore[assignment]
        harness = check_harness(policy, cfg.harness, cfg.task, admin)
        if harness.python is not None:  # at submission, not deep in RUN: the nodes lack it too
            from sandbox.pythons import PythonMissing, find_python

            try:
                find_python(harness.python, policy.harnesses.pythons)
            except PythonMissing as exc:
                raise InvalidRequest(
                    f"agent_config.harness: harness {cfg.harness!r} needs Python {harness.python}: {exc}",
                    field="agent_config.harness",
                    policy="policy.harnesses.pythons",
                ) from None

    def check_instance(self, config: HandlerConfig, instance: dict[str, Any]) -> None:
        """The instance must be one the task kind's handler accepts."""
        get_handler(config.task).validate_instance(instance)  # type: ignore[attr-defined]

    def grades_in_sandbox(self, config: HandlerConfig) -> bool:
        """As the task kind's handler: swe and code in a fresh sandbox, math on the host."""
        return get_handler(config.task).eval_in_sandbox  # type: ignore[attr-defined]

    def sandbox_overrides(self, ctx: RolloutContext) -> dict[str, Any]:
        """RUN's sandbox: the harness's environment, an endpoint folder, no network; EVAL's
        grading sandbox is the task handler's."""
        if ctx.stage == "eval":
            task, view = self._task(ctx)
            return task.sandbox_overrides(view)
        harness = _registration(ctx)
        overrides: dict[str, Any] = {"model_endpoint": True, "network": False}
        if harness.python_env is not None:
            overrides["python_env"] = harness.python_env
        return overrides

    def init(self, ctx: InitContext) -> None:
        """The workspace as the task kind prepares it."""
        if not ctx.workspace or ctx.sandbox is None:
            raise InvalidRequest("the harness agent needs a sandbox", field="sandbox.runtime")
        task, view = self._task(ctx)
        task.init(view)

    def artifact(self, ctx: RunContext, result: Trajectory) -> dict[str, Any]:
        """swe and code: the task handler's; math: the registered answer file's text."""
        cfg: HarnessConfig = ctx.agent_config  # type: ignore[assignment]
        if cfg.task != "math":
            task, view = self._task(ctx)
            return task.artifact(view, result)
        from agents.handlers.math.answer import answer_from_run
        from sandbox.workspace import read_regular

        name = _registration(ctx).answer_file
        data = read_regular(ctx.workspace, name, MAX_ANSWER_BYTES) if ctx.workspace else None
        answer = answer_from_run(data.decode("utf-8", "replace") if data else None, None)
        return {} if answer is None else {"answer": answer}

    def prepare_eval(self, ctx: EvalContext, workspace: str) -> dict[str, Any] | None:
        """The task handler's grading workspace from the stored artifact."""
        task, view = self._task(ctx)
        return task.prepare_eval(view, workspace)

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        """The task handler's grade of the stored artifact."""
        task, view = self._task(ctx)
        return task.evaluate(view)

    # -- RUN: the harness against its endpoint ---------------------------------------------
    def run(self, ctx: RunContext) -> Trajectory:
        """Open the endpoint, start the harness, wait; the endpoint's capture is the result."""
        from agents.harness import RolloutEndpoint
        from sandbox import bridge

        cfg: HarnessConfig = ctx.agent_config  # type: ignore[assignment]
        harness = _registration(ctx)
        token = RolloutEndpoint.new_token()
        run_started = ctx.deadline - ctx.limits.stage_timeout("run")  # before any pause moved it
        started = time.monotonic()
        with RolloutEndpoint(ctx, bridge.endpoint_socket(ctx.sandbox), token) as endpoint:
            program = launch.start(ctx, harness, cfg.task, token)
            ending = launch.wait(ctx, harness, program, started, lambda: endpoint.fatal)
        if endpoint.fatal is not None:  # a cancel or an infrastructure failure: not the agent's
            raise endpoint.fatal
        split = _time_split(ctx, run_started, started)
        outcome, finish_reason = endings.classify(ending, endpoint.counters, split)
        result = endpoint.result(outcome, finish_reason)
        result.metrics.update(
            harness=cfg.harness,
            harness_returncode=ending.returncode,
            harness_seconds=round(time.monotonic() - started, 3),
            time_split=split.to_metrics(),
        )
        result.extra["harness_log"] = ending.log_tail
        return result


def _time_split(ctx: RunContext, run_started: float, launched: float) -> TimeSplit:
    """RUN's time split: the model calls' generation and waiting (the session's clock), the
    harness's own work (its wall time since launch minus those calls), paused pool time."""
    now = time.monotonic()
    clock = ctx.llm.clock
    own = max(0.0, now - launched - clock.generation - clock.waiting - clock.paused)
    return TimeSplit(
        elapsed=now - run_started,
        generation=clock.generation,
        agent_own=own,
        waiting=clock.waiting,
        paused=clock.paused,
        own_label="harness",
    )
