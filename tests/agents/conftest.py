"""Fixtures shared by the handler tests: a real LLM session on the simulator, stage contexts.

`make_llm(script)` serves the LLM simulator (a scripted fake of vLLM's token-id API, encoding
replies with the real SmolLM2 tokenizer) in a thread and opens a real `LLMSession` on it.
`make_ctx(stage=...)` builds the context the pipeline would hand a handler in that stage
(`InitContext`, `RunContext`, `EvalContext`); a RUN context's `record_turn` collects turns into
`ctx.turns_recorded` (a list) instead of the database. `make_ctx(stage, after=ctx)` moves a
rollout on to its next stage (same identity, configs and `state` dict).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dataclasses import dataclass, field

from raas_client.models import Trajectory

from agents.abstract import HandlerConfig
from agents.contexts import EvalContext, InitContext, RolloutContext, RunContext
from agents.job_config import JobConfig
from sandbox.spec import SandboxOptions

TOKENIZER_DIR = str(Path(__file__).resolve().parents[1] / "fixtures" / "smollm2-tokenizer")


@pytest.fixture(scope="session", autouse=True)
def private_sandbox_dir() -> Iterator[str]:
    """Keep this run's sandbox handles out of the default state dir.

    A raas reaper running on this machine (another test run's pipeline, `raas up`) stops every
    sandbox in the default dir that belongs to no live rollout of *its* database, which would
    kill these tests' sandboxes mid-call. `tests.pipeline_harness.start_service` passes the
    folder on to the pools it starts (unless a test names its own `sandbox_dir`).
    """
    import os
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="raas-sbx-", dir="/tmp")  # short: socket paths are limited
    old = os.environ.get("RAAS_SANDBOX_DIR")
    os.environ["RAAS_SANDBOX_DIR"] = path
    yield path
    if old is None:
        os.environ.pop("RAAS_SANDBOX_DIR", None)
    else:
        os.environ["RAAS_SANDBOX_DIR"] = old
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_llm() -> Iterator[Callable[..., Any]]:
    """Factory: (script dict, max_model_len=4096) -> an open LLMSession on a fresh simulator.

    The session's pool is the in-process one for the job's named server: no database.
    """
    from agents.llm import LLMSession
    from fakellm.server import start_simulator

    cleanups: list[Callable[[], None]] = []

    def make(
        script: dict[str, Any],
        max_model_len: int = 4096,
        sampling: dict[str, Any] | None = None,
        server_max: int | None = None,
        report: bool = True,
    ) -> LLMSession:
        """`server_max`: the simulator's own max_model_len (`report`: in GET /v1/models)."""
        url, stop = start_simulator(TOKENIZER_DIR, script, max_model_len=server_max, report_max_model_len=report)
        cleanups.append(stop)
        spec = {"servers": [{"url": url, "model": "sim"}], "tokenizer": TOKENIZER_DIR, "max_model_len": max_model_len}
        session = LLMSession.open(spec, sampling or {"max_tokens": 512}, "rollout-test")
        cleanups.append(session.close)
        return session

    yield make
    for cleanup in reversed(cleanups):
        cleanup()


@dataclass(frozen=True)
class RecordingRunContext(RunContext):
    """A RUN context whose `record_turn` appends to `turns_recorded` (no database)."""

    turns_recorded: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.record_turn is RunContext.record_turn:  # not one of the test's own
            object.__setattr__(self, "record_turn", lambda **turn: self.turns_recorded.append(turn))


@pytest.fixture
def make_ctx() -> Callable[..., RolloutContext]:
    """Factory for a stage's context; `after=` the previous stage's keeps its rollout."""
    from core.settings import load_settings

    def make(
        *,
        stage: str = "run",
        instance: dict[str, Any] | None = None,
        agent_config: HandlerConfig | None = None,
        limits: dict[str, Any] | None = None,
        timeout: float = 60.0,
        sandbox: Any = None,
        llm: Any = None,
        workspace: str | None = None,
        state: dict[str, Any] | None = None,
        cancel_check: Callable[[], bool] = lambda: False,
        job_config: JobConfig | None = None,
        run_result: Trajectory | None = None,
        artifact: dict[str, Any] | None = None,
        resume_turns: list[dict[str, Any]] | None = None,
        record_turn: Callable[..., None] | None = None,
        after: RolloutContext | None = None,
    ) -> RolloutContext:
        if after is not None:
            base = after.rollout_fields()
            sandbox = sandbox if sandbox is not None else getattr(after, "sandbox", None)
            workspace = workspace or getattr(after, "workspace", None)
        else:
            instance = instance or {"instance_id": "test-instance"}
            base = dict(
                rollout_id="rollout-test",
                job_id="job-test",
                instance_id=str(instance.get("instance_id", "test-instance")),
                instance=instance,
                sample_index=0,
                attempt=1,
                agent_config=agent_config or HandlerConfig(),
                job_config=job_config or JobConfig(limits=limits or {}),
                settings=load_settings(),
                deadline=time.monotonic() + timeout,
                state=state if state is not None else {},
                cancel_check=cancel_check,
            )
        if stage == "init":
            return InitContext(**base, sandbox=sandbox, workspace=workspace)
        if stage == "run":
            run: dict[str, Any] = {} if record_turn is None else {"record_turn": record_turn}
            return RecordingRunContext(
                **base, sandbox=sandbox, workspace=workspace, llm=llm, resume_turns=resume_turns, **run
            )
        return EvalContext(
            **base, run_result=run_result or Trajectory(), artifact=artifact, sandbox=sandbox, workspace=workspace
        )

    return make


@pytest.fixture(scope="session")
def built_env() -> Callable[[str, list[str]], str]:
    """Factory: (name, packages) -> absolute path of a sandbox Python environment.

    Built once per machine under the raas home's `envs/` (a no-op when already built with the
    same packages), so a test passes the path as `python_env`.
    """
    from sandbox.environments import build_environment

    def build(name: str, packages: list[str]) -> str:
        return str(build_environment(name, packages))

    return build


@pytest.fixture
def sandbox_settings(private_sandbox_dir: str) -> Any:
    """The node's sandbox settings for these tests: handles in the private state dir."""
    from sandbox import SandboxSettings

    return SandboxSettings(state_dir=private_sandbox_dir)


@pytest.fixture
def make_sandbox(tmp_path: Path, sandbox_settings: Any) -> Iterator[Callable[..., Any]]:
    """Factory: (workspace=None, python_env=None, **options) -> a started real bwrap sandbox.

    The workspace defaults to a fresh folder under tmp_path; every sandbox is stopped at
    teardown.
    """
    from sandbox import SandboxSpec, get_runtime

    started: list[Any] = []

    def make(workspace: str | None = None, python_env: str | None = None, **options: Any) -> Any:
        if workspace is None:
            workspace = str(tmp_path / f"ws{len(started)}")
            Path(workspace).mkdir()
        sb = get_runtime("bwrap", sandbox_settings).start(
            SandboxSpec(workspace=workspace, python_env=python_env, **options), label=f"test:{Path(workspace).name}"
        )
        started.append(sb)
        return sb

    yield make
    for sb in started:
        sb.stop()


@pytest.fixture
def grade_artifact(tmp_path: Path) -> Callable[..., Any]:
    """EVAL as the pipeline runs it: (handler, ctx after RUN, sandbox options) -> EvalResult.

    Kills RUN's sandbox (`ctx.sandbox`), reads the artifact from its dead workspace
    (`handler.artifact(ctx, run_result)`), then grades it through `tasks.sandboxing.grading.grade` in an
    `EvalContext` (a fresh sandbox when the handler asks for one). Calling it again with
    `artifact=` re-grades a stored artifact, which is what re-evaluation does. The last
    artifact graded is `grade_artifact.artifact`.
    """
    from core.settings import Settings
    from tasks.sandboxing import grading

    settings = Settings(home=tmp_path / "eval-home", sandbox_runtime="bwrap")
    count = [0]

    def by_name(sandbox: dict[str, Any]) -> dict[str, Any]:
        """A job names its environment (policy): link a built one into this home's envs."""
        env = sandbox.get("python_env")
        if env is None or not Path(env).is_absolute():
            return sandbox
        link = settings.envs_root / Path(env).name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(env)
        return {**sandbox, "python_env": link.name}

    def grade(
        handler: Any,
        ctx: RolloutContext,
        sandbox: dict[str, Any] | None = None,
        artifact: dict[str, Any] | None = None,
        run_result: Trajectory | None = None,
    ) -> Any:
        run_result = run_result or Trajectory()
        if artifact is None:
            if getattr(ctx, "sandbox", None) is not None:
                ctx.sandbox.stop()
            artifact = handler.artifact(ctx, run_result)
        grade.artifact = artifact
        count[0] += 1
        return grading.grade(
            settings,
            handler,
            ctx.for_eval(run_result, artifact),
            job_sandbox=SandboxOptions.model_validate(by_name(sandbox or {})),
            label=(ctx.rollout_id, count[0]),
            workspace=settings.workspaces / f"eval-{count[0]}",
        )

    grade.artifact = None
    return grade
