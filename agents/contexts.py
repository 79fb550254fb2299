"""What the pipeline hands a handler's hooks, one type per stage.

Every stage knows the rollout (`RolloutContext`: identity, instance, the validated configs, the
node's settings, the stage's deadline, the handler's `state` dict). On top of that each stage
gets exactly what it may use, so a handler author can tell from the type what is set when:

| context | hooks | adds |
| --- | --- | --- |
| `RolloutContext` | `on_failure` | (what all stages share) |
| `InitContext` | `init`, `sandbox_overrides` (before the start) | the started sandbox and its workspace |
| `RunContext` | `run`, `artifact` (+ RUN's record) | `llm`, `record_turn`, `resume_turns`, `diagnose`, sandbox |
| `EvalContext` | `prepare_eval`, `evaluate`, `sandbox_overrides` | `run_result`, `artifact`, the grading sandbox |

All four are frozen, with two exceptions said where they are: `state` is the handler's own
mutable dict in every stage (small JSON, persisted between the stages of one attempt), and
RUN's `deadline` moves on by the time a weight push paused the server pool
(`RunContext.extend_deadline`: the agent's clock stood still). The pipeline builds them in one
place (`tasks.contexts`); tests build them with the same constructors.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import BaseModel
from raas_client.models import Trajectory

from agents.job_config import JobConfig, Limits
from core.errors import RolloutCancelled, StageTimeout
from core.settings import Settings

if TYPE_CHECKING:
    from agents.llm.session import LLMSession
    from sandbox.toolserver.protocol import BashResult, PythonResult


class AgentSandbox(Protocol):
    """What agents use of a sandbox (`sandbox.Sandbox` is one); tools go through this only."""

    @property
    def workspace(self) -> str:
        """The workspace path, identical on the host and inside the sandbox."""

    def bash(self, command: str, timeout: float | None = None) -> BashResult:
        """Run a command in the persistent shell."""

    def python(self, code: str, timeout: float | None = None) -> PythonResult:
        """Run code in the persistent Python session."""

    def edit(self, command: str, path: str, **kwargs: Any) -> str:
        """str_replace_editor; misuse raises `sandbox.ToolUsageError` (shown to the model)."""

    def read_file(self, path: str) -> str:
        """Text of a workspace file."""

    def write_file(self, path: str, content: str) -> None:
        """Create or overwrite a workspace file."""

    def reset(self) -> None:
        """Kill every tool process; the next call starts fresh."""


class WorkspaceCheckpoints(Protocol):
    """A RUN's workspace checkpoints (`tasks.sandboxing.checkpoints`), when the job has them."""

    def save(self, turn: int, counts: dict[str, Any]) -> None:
        """Checkpoint the workspace after `turn`; what happened is counted in `counts`."""

    def restore(self, attempt: int, last_logged: int, counts: dict[str, Any]) -> int:
        """Restore `attempt`'s latest checkpoint here; its turn, or -1 (replay everything)."""


def _never() -> bool:
    return False


@dataclass(frozen=True)
class RolloutContext:
    """What every stage knows of one rollout attempt (all that `sandbox_overrides` may read).

    `settings` are the node's operator settings (repository mirrors, image and corpus roots):
    handlers read them here, never from the environment. `deadline` is a `time.monotonic()`
    value; `cancel_check` says whether the rollout was asked to stop.
    """

    stage: ClassVar[str] = "any"

    rollout_id: str
    job_id: str
    instance_id: str
    instance: dict[str, Any]
    sample_index: int
    attempt: int
    agent_config: BaseModel  # the handler's `Config` (an `agents.abstract.HandlerConfig`)
    job_config: JobConfig
    settings: Settings
    deadline: float
    state: dict[str, Any] = field(default_factory=dict)
    cancel_check: Callable[[], bool] = _never
    logger: logging.Logger | logging.LoggerAdapter | None = None

    @property
    def limits(self) -> Limits:
        """The job's limits (max_turns, per-stage timeouts, tool_timeout, ...)."""
        return self.job_config.limits

    def remaining(self) -> float:
        """Seconds left before this stage's deadline (never negative)."""
        return max(0.0, self.deadline - time.monotonic())

    def checkpoint(self) -> None:
        """Raise if the rollout was cancelled or the stage is out of time (between turns)."""
        if self.cancel_check():
            raise RolloutCancelled("rollout cancelled", rollout_id=self.rollout_id)
        if self.remaining() <= 0:
            raise StageTimeout(f"{self.stage} deadline passed", rollout_id=self.rollout_id)

    def rollout_fields(self) -> dict[str, Any]:
        """This context's `RolloutContext` fields (what the next stage's context keeps)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(RolloutContext)}

    def for_init(self, sandbox: AgentSandbox | None, workspace: str | None) -> InitContext:
        """INIT's context once its sandbox started (None, None for runtime "none")."""
        return InitContext(**self.rollout_fields(), sandbox=sandbox, workspace=workspace)

    def for_run(self, sandbox: AgentSandbox | None, workspace: str | None, **run: Any) -> RunContext:
        """RUN's context: `run` holds llm, record_turn, settle_turns, resume_turns and diagnose."""
        return RunContext(**self.rollout_fields(), sandbox=sandbox, workspace=workspace, **run)

    def for_eval(self, run_result: Trajectory, artifact: dict[str, Any] | None) -> EvalContext:
        """EVAL's context before its grading sandbox starts (`with_sandbox` adds it)."""
        return EvalContext(**self.rollout_fields(), run_result=run_result, artifact=artifact)


class _GetsSandbox:
    """A context whose sandbox starts after it is built (INIT's, EVAL's grading one)."""

    def with_sandbox(self, sandbox: AgentSandbox, workspace: str | None) -> Any:
        """The same context with its sandbox started."""
        return dataclasses.replace(self, sandbox=sandbox, workspace=workspace)


@dataclass(frozen=True)
class InitContext(_GetsSandbox, RolloutContext):
    """INIT: the sandbox being prepared (`sandbox` None when the handler needs none, and in
    `sandbox_overrides`, which is asked before it starts)."""

    stage: ClassVar[str] = "init"

    sandbox: AgentSandbox | None = None
    workspace: str | None = None


def _no_turn(**_turn: Any) -> None:
    return None


def _nothing_to_settle() -> None:
    return None


def _no_diagnosis(_exc: BaseException) -> str | None:
    return None


@dataclass(frozen=True)
class RunContext(RolloutContext):
    """RUN: the agent's sandbox, the rollout's LLM session and the turn log.

    `record_turn` hands one turn to the turn log, which writes it in the background (the next
    generation overlaps the commit); `settle_turns()` returns once every turn handed over is
    durable. The shared loop settles before a turn's tool calls run and before it returns,
    and the stage settles before the hand-on, so at most the turn in flight is unlogged while
    its tool calls' effects exist (what resume relies on). `resume_turns` holds the logged turns
    a RUN continues after: the attempt's own when a lost RUN continues in the same sandbox (see
    `AgentHandler.resumable`), an earlier attempt's when a lost sandbox is replayed (the loop's
    tool calls, or a restarted harness's model calls: `AgentHandler.replays_calls`);
    `diagnose(exc)` says whether a sandbox failure is the agent's doing ("disk_quota", "oom",
    ...) or None (infrastructure).
    """

    stage: ClassVar[str] = "run"

    sandbox: AgentSandbox | None = None
    workspace: str | None = None
    llm: LLMSession | None = None
    record_turn: Callable[..., None] = _no_turn
    settle_turns: Callable[[], None] = _nothing_to_settle
    resume_turns: list[dict[str, Any]] | None = None
    diagnose: Callable[[BaseException], str | None] = _no_diagnosis
    # Called by the shared loop between turns (the last turn handed to the log, the next not
    # generated): the pipeline raises there to hand the rollout back (a draining node).
    turn_boundary: Callable[[], None] = _nothing_to_settle
    # The job's workspace checkpoints (`resume.checkpoints`): saved by the shared loop after
    # each turn, restored before a replay (`agents.loop_replay`); None when off.
    checkpoints: WorkspaceCheckpoints | None = None

    def extend_deadline(self, seconds: float) -> None:
        """Move the deadline on by `seconds` the agent did not have (a paused server pool):
        the one field of a context that changes after it is built."""
        object.__setattr__(self, "deadline", self.deadline + seconds)


@dataclass(frozen=True)
class EvalContext(_GetsSandbox, RolloutContext):
    """EVAL (and re-evaluation): RUN's stored trajectory and artifact, and where to grade.

    `sandbox`/`workspace` are the FRESH grading sandbox of an `eval_in_sandbox` handler (set for
    `evaluate`, not yet for `prepare_eval`), else None: RUN's sandbox is never seen here.
    """

    stage: ClassVar[str] = "eval"

    run_result: Trajectory = field(default_factory=Trajectory)
    artifact: dict[str, Any] | None = None
    sandbox: AgentSandbox | None = None
    workspace: str | None = None
