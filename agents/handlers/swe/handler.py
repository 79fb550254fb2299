"""`swe`: fix a bug in a repository; reward 1 iff every FAIL_TO_PASS and PASS_TO_PASS test passes.

Instances have SWE-bench's shape (`instance_id` beside the data; in it `repo`, `base_commit`,
`problem_statement`, `test_patch`, `FAIL_TO_PASS`, `PASS_TO_PASS`, optional `test_cmd`); `repo`
is a local git directory, a tarball, or plain sources (committed deterministically, see
`swe_repo`). INIT checks the repo out at the base commit as the workspace; RUN gives the agent
bash, the file editor and `submit`. When RUN ends the pipeline kills the sandbox and the
artifact is the agent's file changes against a clean checkout (`swe_diff`, no git on the
agent's `.git`). EVAL checks the base commit out again into a fresh workspace, applies the
changes minus test files and test infrastructure (`extra["dropped_files"]`), and grades it in
a fresh sandbox (`swe_eval`). Re-evaluation is the same EVAL on the stored artifact.
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any, Literal

from pydantic import Field

from agents.abstract import AgentHandler, EvalResult, SandboxToolsConfig, Trajectory
from agents.contexts import EvalContext, InitContext, RolloutContext, RunContext
from agents.handlers.swe import diff as swe_diff, evaluate as swe_eval, guard as swe_guard
from agents.handlers.swe.images import resolve_instance_image
from agents.handlers.swe.repo import check_repo_name, materialize
from agents.loop import run_configured_loop
from agents.registry import register
from agents.tools import builtin_tools, finish_tool
from core.errors import InvalidRequest
from sandbox.workspace import walk

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
    "repo": str,
    "base_commit": str,
    "problem_statement": str,
    "test_patch": str,
    "FAIL_TO_PASS": (list, str),
    "PASS_TO_PASS": (list, str),
}


class SWEConfig(SandboxToolsConfig):
    """Agent config of `swe` jobs (prompts, tools, limits, evaluation)."""

    system_prompt: str = Field(SYSTEM_PROMPT, description="System message")
    user_prompt: str = Field(
        USER_PROMPT, description="User message; {problem_statement}, {workspace}, {instance_id} are filled in"
    )
    tools: list[Literal["bash", "str_replace_editor", "python"]] = Field(
        default_factory=lambda: ["bash", "str_replace_editor"], description="Built-in tools besides `submit`"
    )
    python_env: str | None = Field(
        "pytest", description="Sandbox Python environment with pytest (None: the job's choice)"
    )
    test_timeout: float = Field(300.0, gt=0, description="Seconds for EVAL's test run")
    scan_runner_refs: bool = Field(
        True,
        description="Reward 0 without running tests when the graded diff adds lines "
        "naming test-runner internals (`_pytest`, pytest hooks, pluggy, "
        "`sys.modules`, unittest result classes, `atexit`, `os._exit`); off "
        "for datasets whose fixes legitimately touch them",
    )


def _read_text(root: str, path: str) -> str:
    """A clean checkout's file as text ("" when the agent created it or it is not text)."""
    try:
        with open(os.path.join(root, path), encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return ""


def validate_swe_instance(instance: dict[str, Any]) -> None:
    """Reject an instance missing a SWE-bench field (the error names it)."""
    for name, kind in REQUIRED_FIELDS.items():
        if name not in instance or instance[name] in (None, ""):
            raise InvalidRequest(f"swe instance is missing required field {name!r}", field=f"instance.{name}")
        if not isinstance(instance[name], kind):
            raise InvalidRequest(f"swe instance field {name!r} has the wrong type", field=f"instance.{name}")
    for name in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        try:
            swe_eval.listed_tests(instance[name])
        except ValueError:
            raise InvalidRequest(f"{name} must be a list of test ids", field=f"instance.{name}") from None
    if not swe_eval.listed_tests(instance["FAIL_TO_PASS"]):
        raise InvalidRequest("FAIL_TO_PASS lists no test", field="instance.FAIL_TO_PASS")
    if "test_cmd" in instance and not isinstance(instance["test_cmd"], str):
        raise InvalidRequest("test_cmd must be a string", field="instance.test_cmd")
    check_repo_name(instance["repo"])


@register
class SWEHandler(AgentHandler):
    """Bug fixing in a git repo, graded by the instance's tests in the sandbox."""

    name = "swe"
    resumable = True  # run() is the shared loop
    forkable_init = True  # init is a checkout at the base commit: the same for every sample
    Config = SWEConfig
    environments = {"pytest": ("pytest",)}

    def validate_instance(self, instance: dict[str, Any]) -> None:
        """Reject an instance missing a SWE-bench field (the error names it)."""
        validate_swe_instance(instance)

    def sandbox_overrides(self, ctx: RolloutContext) -> dict[str, Any]:
        """The instance's own image when the operator has an image root, else `python_env`."""
        image_root = ctx.settings.image_root
        if image_root is None:
            return super().sandbox_overrides(ctx)
        runtime = ctx.job_config.sandbox.runtime or ctx.settings.sandbox_runtime
        return resolve_instance_image(ctx.instance_id, image_root, runtime)

    def init(self, ctx: InitContext) -> None:
        """Check the repo out at its base commit as the workspace."""
        if not ctx.workspace:
            raise InvalidRequest("the swe agent needs a sandbox", field="sandbox.runtime")
        materialize(
            ctx.instance["repo"],
            ctx.instance["base_commit"],
            ctx.workspace,
            ctx.settings.repo_root,
            ctx.settings.repo_mirror_root,
        )
        ctx.state.update(workspace=ctx.workspace, base_commit=ctx.instance["base_commit"])

    def init_fork(self, ctx: InitContext) -> None:
        """A forked sample: the checkout is its group's; only its own state is set here."""
        ctx.state.update(workspace=ctx.workspace, base_commit=ctx.instance["base_commit"])

    def run(self, ctx: RunContext) -> Trajectory:
        """The shared loop with bash, the editor and `submit`."""
        cfg: SWEConfig = ctx.agent_config  # type: ignore[assignment]
        user = cfg.user_prompt.format(
            problem_statement=ctx.instance["problem_statement"], workspace=ctx.workspace, instance_id=ctx.instance_id
        )
        submit = finish_tool("submit", "Submit your changes to the repository and end the task.", answer_param=None)
        return run_configured_loop(ctx, cfg, user_prompt=user, tools=[*builtin_tools(cfg.tools), submit])

    eval_in_sandbox = True

    def artifact(self, ctx: RunContext, result: Trajectory) -> dict[str, Any]:
        """The agent's changes: its dead workspace compared with a clean base checkout."""
        with tempfile.TemporaryDirectory(prefix="raas-swe-base-") as clean:
            materialize(
                ctx.instance["repo"],
                ctx.instance["base_commit"],
                clean,
                ctx.settings.repo_root,
                ctx.settings.repo_mirror_root,
            )
            return swe_diff.workspace_changes(ctx.workspace, clean)

    def prepare_eval(self, ctx: EvalContext, workspace: str) -> dict[str, Any]:
        """A clean checkout plus the agent's changes, minus tests and test infrastructure."""
        materialize(
            ctx.instance["repo"],
            ctx.instance["base_commit"],
            workspace,
            ctx.settings.repo_root,
            ctx.settings.repo_mirror_root,
        )
        changes = (ctx.artifact or {}).get("files") or {}
        kept, dropped = swe_diff.split_changes(
            changes, set(walk(workspace).files), swe_diff.test_patch_paths(ctx.instance["test_patch"])
        )
        patch = swe_diff.display_patch(workspace, kept)
        refs = swe_guard.runner_refs(kept, lambda path: _read_text(workspace, path))
        ctx.state["runner_refs"] = refs
        swe_diff.apply_changes(workspace, kept)
        return {
            "git_patch": patch,
            "dropped_files": sorted(dropped),
            "runner_refs": refs,
            "dropped_reasons": dropped,
            "skipped_files": sorted((ctx.artifact or {}).get("skipped") or {}),
        }

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        """Grade the prepared workspace in the fresh sandbox with the instance's tests."""
        cfg: SWEConfig = ctx.agent_config  # type: ignore[assignment]
        refs = ctx.state.get("runner_refs") or []
        if cfg.scan_runner_refs and refs:
            return EvalResult(
                0.0,
                {"resolved": False, "runner_tampering": True},
                {
                    "eval_error": "the diff names test-runner internals: "
                    + ", ".join(f"{r['path']}:{r['line']} {r['match']}" for r in refs[:5])
                },
            )
        return swe_eval.grade(
            ctx.instance, ctx.workspace, ctx.sandbox, min(cfg.test_timeout, max(1.0, ctx.remaining()))
        )
