"""`swe`: fix a bug in a repository; reward 1 iff every FAIL_TO_PASS and PASS_TO_PASS test passes.

Instances have SWE-bench's shape (`instance_id` beside the data; in it `repo`, `base_commit`,
`problem_statement`, `test_patch`, `FAIL_TO_PASS`, `PASS_TO_PASS`, optional `test_cmd`); `repo`
is a local git directory, a tarball, or plain sources (committed deterministically, see `swe_repo`). INIT
checks the repo out at the base commit as the workspace; RUN gives the agent bash, the file
editor and `submit`; EVAL grades the workspace in the same sandbox (`swe_eval.grade`) and keeps
the agent's `git diff` in `extra["git_patch"]`. `reevaluate()` grades a stored patch again in a
fresh sandbox (the `POST /v1/rollouts/{id}/reevaluate` route).
"""
from __future__ import annotations

import logging
import shutil
import tempfile
from typing import Any, Literal

from pydantic import Field

from agents.base import AgentHandler, EvalResult, HandlerConfig, RunResult, StageContext
from agents.handlers import swe_eval
from agents.handlers.swe_images import resolve_instance_image
from agents.handlers.swe_repo import materialize
from agents.loop import run_agent_loop
from agents.registry import register
from agents.tools import builtin_tools, finish_tool
from core.errors import InvalidRequest

log = logging.getLogger(__name__)

SYSTEM_PROMPT = """You are an autonomous software engineer working in a git repository.
Investigate the problem, reproduce it, and fix it by editing the source code. Do not modify the
existing tests; you may add your own checks. Work only through the tools. When your fix is
complete, call the `submit` tool."""

USER_PROMPT = """The repository is checked out in {workspace} (your current directory).

<problem_statement>
{problem_statement}
</problem_statement>

Make the smallest change to the non-test source files that resolves the problem."""

REQUIRED_FIELDS: dict[str, type | tuple[type, ...]] = {
    "repo": str, "base_commit": str, "problem_statement": str,
    "test_patch": str, "FAIL_TO_PASS": (list, str), "PASS_TO_PASS": (list, str),
}


class SWEConfig(HandlerConfig):
    """Agent config of `swe` jobs (prompts, tools, limits, evaluation)."""

    system_prompt: str = Field(SYSTEM_PROMPT, description="System message")
    user_prompt: str = Field(USER_PROMPT, description="User message; {problem_statement}, "
                                                      "{workspace}, {instance_id} are filled in")
    tools: list[Literal["bash", "str_replace_editor", "python"]] = Field(
        default_factory=lambda: ["bash", "str_replace_editor"],
        description="Built-in tools besides `submit`")
    max_turns: int | None = Field(None, ge=1, description="Overrides limits.max_turns")
    max_invalid_turns: int = Field(3, ge=1, description="Turns with no valid action -> agent_error")
    python_env: str | None = Field("pytest", description="Sandbox Python environment with "
                                                         "pytest (None: the job's choice)")
    test_timeout: float = Field(300.0, gt=0, description="Seconds for EVAL's test run")
    repo_root: str | None = Field(None, description="Base of relative `repo` paths "
                                                    "(default: the raas checkout)")


def _settings() -> Any:
    """The node's operator settings (repository mirror and image root live there)."""
    from core.settings import load_settings

    return load_settings()


def validate_swe_instance(instance: dict[str, Any]) -> None:
    """Reject an instance missing a SWE-bench field (the error names it)."""
    for name, kind in REQUIRED_FIELDS.items():
        if name not in instance or instance[name] in (None, ""):
            raise InvalidRequest(f"swe instance is missing required field {name!r}",
                                 field=f"instance.{name}")
        if not isinstance(instance[name], kind):
            raise InvalidRequest(f"swe instance field {name!r} has the wrong type",
                                 field=f"instance.{name}")
    for name in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        try:
            swe_eval.listed_tests(instance[name])
        except ValueError:
            raise InvalidRequest(f"{name} must be a list of test ids",
                                 field=f"instance.{name}") from None
    if not swe_eval.listed_tests(instance["FAIL_TO_PASS"]):
        raise InvalidRequest("FAIL_TO_PASS lists no test", field="instance.FAIL_TO_PASS")
    if "test_cmd" in instance and not isinstance(instance["test_cmd"], str):
        raise InvalidRequest("test_cmd must be a string", field="instance.test_cmd")


@register
class SWEHandler(AgentHandler):
    """Bug fixing in a git repo, graded by the instance's tests in the sandbox."""

    name = "swe"
    Config = SWEConfig
    environments = {"pytest": ("pytest",)}

    def validate_instance(self, instance: dict[str, Any]) -> None:
        """Reject an instance missing a SWE-bench field (the error names it)."""
        validate_swe_instance(instance)

    def sandbox_overrides(self, ctx: StageContext) -> dict[str, Any]:
        """The instance's own image when the operator has an image root, else `python_env`."""
        image_root = _settings().image_root
        if image_root is None:
            return super().sandbox_overrides(ctx)
        runtime = (ctx.job_config.get("sandbox") or {}).get("runtime") \
            or _settings().sandbox_runtime
        return resolve_instance_image(ctx.instance_id, image_root, runtime)

    def init(self, ctx: StageContext) -> None:
        """Check the repo out at its base commit as the workspace."""
        cfg: SWEConfig = ctx.agent_config  # type: ignore[assignment]
        if not ctx.workspace:
            raise InvalidRequest("the swe agent needs a sandbox", field="sandbox.runtime")
        materialize(ctx.instance["repo"], ctx.instance["base_commit"], ctx.workspace,
                    cfg.repo_root, _settings().repo_mirror_root)
        ctx.state.update(workspace=ctx.workspace, base_commit=ctx.instance["base_commit"])

    def run(self, ctx: StageContext) -> RunResult:
        """The shared loop with bash, the editor and `submit`."""
        cfg: SWEConfig = ctx.agent_config  # type: ignore[assignment]
        user = cfg.user_prompt.format(problem_statement=ctx.instance["problem_statement"],
                                      workspace=ctx.workspace,
                                      instance_id=ctx.instance_id)
        submit = finish_tool("submit", "Submit your changes to the repository and end the task.",
                             answer_param=None)
        return run_agent_loop(ctx, system_prompt=cfg.system_prompt, user_prompt=user,
                              tools=[*builtin_tools(cfg.tools), submit],
                              max_turns=cfg.max_turns, max_invalid_turns=cfg.max_invalid_turns)

    def evaluate(self, ctx: StageContext) -> EvalResult:
        """Store the agent's diff, then grade the workspace with the instance's tests."""
        cfg: SWEConfig = ctx.agent_config  # type: ignore[assignment]
        workspace = ctx.state.get("workspace") or ctx.workspace
        return evaluate_workspace(ctx.sandbox, workspace, ctx.instance,
                                  min(cfg.test_timeout, max(1.0, ctx.remaining())))

    def reevaluate(self, instance: dict[str, Any], git_patch: str | None,
                   **kwargs: Any) -> EvalResult:
        """Grade a stored patch again in a fresh sandbox (see the module function)."""
        return reevaluate(instance, git_patch, **kwargs)


def evaluate_workspace(sb: Any, workspace: str, instance: dict[str, Any],
                       test_timeout: float) -> EvalResult:
    """EVAL of a live workspace: fresh shell, capture `git diff`, then grade."""
    sb.reset()  # a fresh shell: nothing the agent set up in its shell survives into grading
    patch = swe_eval.capture_patch(sb, workspace, instance["base_commit"])
    if patch is None:
        return EvalResult(0.0, {"resolved": False}, {
            "git_patch": None, "eval_error": "git could not diff the workspace (repo broken?)"})
    return swe_eval.grade(instance, workspace, sb, test_timeout, patch=patch)


def reevaluate(instance: dict[str, Any], git_patch: str | None, *,
               agent_config: dict[str, Any] | None = None,
               sandbox_options: dict[str, Any] | None = None,
               runtime: str = "bwrap", workspace_root: str | None = None,
               sandbox_settings: Any = None) -> EvalResult:
    """Re-run EVAL for a stored patch: fresh workspace at base commit, fresh sandbox.

    `agent_config` is the job's (validated here), `sandbox_options` the job's sandbox options
    (the handler's python_env unless the job chose one); the sandbox and its workspace are
    always removed. A patch that no longer applies gives reward 0 with the reason in extra.
    `sandbox_settings` are the node's (`sandbox.SandboxSettings`); the sandbox's handle lives
    in `<their state dir>/reevaluate`,
    away from the node reaper's sweep, which stops sandboxes that belong to no live rollout.
    """
    from sandbox import SandboxSettings, SandboxSpec, get_runtime
    from sandbox.handles import state_root

    validate_swe_instance(instance)
    cfg = SWEConfig.model_validate(agent_config or {})
    options = {k: v for k, v in (sandbox_options or {}).items() if k != "runtime" and v is not None}
    if cfg.python_env and not options.get("python_env"):
        options["python_env"] = cfg.python_env
    workspace = tempfile.mkdtemp(prefix="raas-reeval-", dir=workspace_root)
    sb = None
    try:
        materialize(instance["repo"], instance["base_commit"], workspace, cfg.repo_root,
                    _settings().repo_mirror_root)
        node = sandbox_settings or SandboxSettings()
        state_dir = state_root(node.state_dir) / "reevaluate"
        sb = get_runtime(runtime, node, state_dir=state_dir).start(
            SandboxSpec(workspace=workspace, **options),
            label=f"reevaluate:{instance.get('instance_id', 'instance')}")
        problem = swe_eval.apply_patch(sb, workspace, git_patch or "", swe_eval.AGENT_PATCH)
        if problem is not None:
            return EvalResult(0.0, {"resolved": False, "patch_applied": False}, {
                "git_patch": git_patch, "eval_error": f"patch did not apply: {problem}"})
        result = swe_eval.grade(instance, workspace, sb, cfg.test_timeout, patch=git_patch)
        result.metrics["patch_applied"] = True
        return result
    finally:
        if sb is not None:
            sb.stop()
        shutil.rmtree(workspace, ignore_errors=True)
