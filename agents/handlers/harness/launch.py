"""Starting a registered harness in its sandbox and waiting for it (the RUN of `harness`).

What the harness gets: the task text in `task_file` (and as `{task}`), its registered argv
and variables with the placeholders filled, the endpoint variables pointing at the loopback
relay with this attempt's token, and a writable HOME (`HOME_DIR`, on the sandbox's own /tmp,
never in the workspace) holding the registration's `files` filled the same way. The wait
polls the detached program between cancel checks; the harness's own deadline (registration
`timeout`) and the stage's remaining time both end it, and its trajectory is kept either way.
"""

from __future__ import annotations

import base64
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.errors import RolloutCancelled
from core.harnesses import HOME_DIR, HarnessRegistration, file_path, fill_file
from sandbox import bridge

POLL_SECONDS = 0.25
# Time kept back from the stage deadline for stopping the harness and closing the endpoint.
STOP_MARGIN = 3.0


def task_text(kind: str, instance: dict[str, Any], workspace: str, harness: HarnessRegistration) -> str:
    """The task as the harness reads it: the task kind's own user prompt by default."""
    if harness.task_field is not None:
        return str(instance.get(harness.task_field, ""))
    if kind == "swe":
        from agents.handlers.swe.handler import USER_PROMPT

        return USER_PROMPT.format(
            problem_statement=instance["problem_statement"],
            workspace=workspace,
            instance_id=instance.get("instance_id", ""),
        )
    if kind == "code":
        from agents.handlers.code.handler import USER_PROMPT, solution_file

        return USER_PROMPT.format(
            problem_statement=instance["problem_statement"], solution_file=solution_file(instance), workspace=workspace
        )
    return (
        f"{instance['problem']}\n\nWhen you are sure, write only the final answer (a number "
        f"or a simplified expression, no words) to the file {harness.answer_file} in "
        f"{workspace}."
    )


def render(
    harness: HarnessRegistration, fields: dict[str, str], endpoint: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """(argv, variables) with the placeholders filled (registrations were checked to use
    only known ones); the endpoint variables win over the registration's `env`."""
    argv = [arg.format(**fields) for arg in harness.command]
    env = {k: v.format(**fields) for k, v in harness.env.items()}
    env.update({k: v.format(**fields, **endpoint) for k, v in harness.endpoint_env.items()})
    return argv, env


def home_script(harness: HarnessRegistration, values: dict[str, str]) -> str:
    """One shell command making the rollout's HOME (0700) and writing the registration's
    `files` into it (and /tmp) with their placeholders filled."""
    words = [f"umask 077 && mkdir -p {HOME_DIR}"]
    for path, template in harness.files.items():
        target = file_path(path)
        data = base64.b64encode(fill_file(template, values).encode()).decode()
        folder = shlex.quote(target.rsplit("/", 1)[0])
        words.append(f"mkdir -p {folder} && printf %s {data} | base64 -d > {shlex.quote(target)}")
    return " && ".join(words)


def write_home(sb: Any, harness: HarnessRegistration, values: dict[str, str]) -> None:
    """Make the rollout's HOME and its config files inside the sandbox."""
    result = sb.bash(home_script(harness, values), timeout=bridge.START_TIMEOUT)
    if result.exit_code != 0:
        raise bridge.BridgeError(f"cannot write the harness's files: {result.output[-500:]!r}")


@dataclass
class Ending:
    """How the harness ended: outcome, finish reason and what it said."""

    outcome: str
    finish_reason: str
    returncode: int | None
    log_tail: str


def start(ctx: Any, harness: HarnessRegistration, kind: str, token: str) -> bridge.Detached:
    """Relay, task file, then the harness itself, detached in the sandbox."""
    sb = ctx.sandbox
    port = bridge.start_relay(sb)
    text = task_text(kind, ctx.instance, ctx.workspace, harness)
    bridge.write_text(sb, harness.task_file, text)
    fields = {
        "task_file": harness.task_file,
        "task": text,
        "workspace": ctx.workspace,
        "model": harness.model,
        "answer_file": harness.answer_file,
    }
    root = f"http://127.0.0.1:{port}"
    endpoint = {"base_url": f"{root}/v1", "root_url": root, "token": token, "port": str(port)}
    write_home(sb, harness, {**fields, **endpoint})
    argv, env = render(harness, fields, endpoint)
    return bridge.start_detached(sb, argv, {"HOME": HOME_DIR, **env}, ctx.workspace)  # never the registration's


def wait(
    ctx: Any,
    harness: HarnessRegistration,
    program: bridge.Detached,
    started: float,
    fatal: Callable[[], BaseException | None] = lambda: None,
) -> Ending:
    """Poll until the harness exits, its deadline or the stage's passes, or a cancel; a
    failure the endpoint ran into (`fatal`: a cancel, no inference server) is raised."""
    sb = ctx.sandbox
    while True:
        # a paused pool stops both clocks: RUN's deadline and the harness's own timeout
        end = min(started + harness.timeout + _paused(ctx), ctx.deadline - STOP_MARGIN)
        failure = fatal()
        if failure is not None:
            bridge.stop_detached(sb, program)
            raise failure
        code = bridge.detached_status(sb, program)
        if code is not None:
            tail = bridge.log_tail(sb, program)
            if code == 0:
                return Ending("completed", "finish", 0, tail)
            return Ending("agent_error", "harness_exit", code, tail)
        if ctx.cancel_check():
            bridge.stop_detached(sb, program)
            raise RolloutCancelled("rollout cancelled", rollout_id=ctx.rollout_id)
        if time.monotonic() >= end:
            bridge.stop_detached(sb, program)
            return Ending("timeout", "deadline", None, bridge.log_tail(sb, program))
        time.sleep(POLL_SECONDS)


def _paused(ctx: Any) -> float:
    """Seconds the rollout's model calls waited on a paused pool (not the harness's time)."""
    clock = getattr(getattr(ctx, "llm", None), "clock", None)
    return clock.paused if clock is not None else 0.0
