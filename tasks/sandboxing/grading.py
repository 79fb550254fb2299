"""EVAL's one code path, shared by the EVAL stage and re-evaluation.

The artifact RUN stored is graded without trusting RUN's sandbox: handlers with
`eval_in_sandbox` get a FRESH sandbox (new tool server, socket and process tree, no network)
on a fresh workspace that `prepare_eval` fills from the instance's clean state plus the
artifact; the others grade on the host. The grading sandbox is always released. It comes from
the EVAL process's warm pool when that holds one of its shape (`prepare_eval` then fills the
claimed slot folder, handed to the sandbox's uid after), else it starts cold on `workspace`.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents.abstract import AgentHandler, EvalResult
from agents.contexts import EvalContext
from core.settings import Settings
from sandbox.spec import SandboxOptions
from tasks.sandboxing import sandboxes

log = logging.getLogger(__name__)

# The grading sandbox returns test reports through the tool's output: room for big ones.
EVAL_OUTPUT_BYTES = 32 * 1024 * 1024


def eval_options(job_sandbox: SandboxOptions, overrides: dict[str, Any]) -> dict[str, Any]:
    """The job's sandbox options for grading: the handler's overrides, no network, big output."""
    options = sandboxes.merged_options(job_sandbox, overrides)
    options["network"] = False
    options["limits"] = {**(options.get("limits") or {}), "output_bytes": EVAL_OUTPUT_BYTES}
    return options


def grade(
    settings: Settings,
    handler: AgentHandler,
    ctx: EvalContext,
    *,
    job_sandbox: SandboxOptions,
    label: tuple[str, int],
    workspace: Path,
    state_dir: str | None = None,
    on_start: Callable[[dict[str, Any]], None] | None = None,
) -> EvalResult:
    """Grade `ctx.artifact`; `on_start(handle)` lets the caller record the grading sandbox."""
    if not handler.grades_in_sandbox(ctx.agent_config):
        return handler.evaluate(ctx)
    handle = None
    try:
        options = eval_options(job_sandbox, handler.sandbox_overrides(ctx))
        runtime = sandboxes.wanted_runtime(settings, job_sandbox, True)
        runtime = options.get("runtime") or runtime  # a handler's override wins
        warm = sandboxes.claim(settings, options, *label, runtime) if state_dir is None else None
        if warm is not None:  # filled after the claim, then handed to the sandbox's uid
            sb, handle = warm
            if on_start is not None:
                on_start(handle)
            notes = handler.prepare_eval(ctx, sb.workspace) or {}
            sandboxes.hand_over(handle)
        else:
            shutil.rmtree(workspace, ignore_errors=True)
            workspace.mkdir(parents=True)
            notes = handler.prepare_eval(ctx, str(workspace)) or {}
            sb, handle = sandboxes.start(
                settings, options, label[0], label[1], runtime, workspace=workspace, state_dir=state_dir
            )
            if on_start is not None:
                on_start(handle)
        result = handler.evaluate(ctx.with_sandbox(sb, sb.workspace))
        result.extra = {**notes, **result.extra}
        return result
    finally:
        if handle is not None:
            sandboxes.release(handle)
        shutil.rmtree(workspace, ignore_errors=True)
