"""A plain agent on the official `openai` SDK with tool calling (raas's example harness).

It knows nothing of raas: it reads its task from a file, talks to whatever
`OPENAI_BASE_URL`/`OPENAI_API_KEY` (or, with `--api anthropic`, `ANTHROPIC_BASE_URL`/
`ANTHROPIC_API_KEY`) point at, runs the `bash` tool calls the model makes in the current
directory, and stops when the model calls `submit` or answers without a tool call. Install it
into a sandbox environment with
`raas env build openai-agent --package openai --package anthropic --package <raas>/core/harness_launchers/harness`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

SYSTEM = (
    "You are an autonomous agent working in a sandbox. Use the `bash` tool to inspect and "
    "change files in the current directory. When the task is done, call `submit`."
)
BASH = {
    "name": "bash",
    "description": "Run a bash command in the current directory; returns its output and exit code.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}
SUBMIT = {"name": "submit", "description": "End the task.", "parameters": {"type": "object", "properties": {}}}
OUTPUT_CHARS = 10_000


def run_bash(command: str, timeout: float) -> str:
    """The observation of one bash call: output (capped) and exit code."""
    try:
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"[timed out after {timeout:g}s]"
    out = (done.stdout + done.stderr)[-OUTPUT_CHARS:]
    return f"{out}\n[exit code {done.returncode}]"


def act(name: str, arguments: dict, timeout: float) -> str | None:
    """Run one tool call; None means `submit` (the episode ends)."""
    if name == "submit":
        return None
    if name != "bash" or not isinstance(arguments.get("command"), str):
        return f"unknown tool or bad arguments: {name} {arguments}"
    return run_bash(arguments["command"], timeout)


def openai_loop(task: str, model: str, steps: int, timeout: float) -> int:
    """The chat-completions loop with tool calls."""
    from openai import OpenAI

    client = OpenAI()
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    tools = [{"type": "function", "function": f} for f in (BASH, SUBMIT)]
    for _ in range(steps):
        reply = client.chat.completions.create(model=model, messages=messages, tools=tools)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return 0
        for call in message.tool_calls:
            try:
                arguments = json.loads(call.function.arguments or "{}")
            except ValueError:
                arguments = {}
            observation = act(call.function.name, arguments, timeout)
            if observation is None:
                return 0
            messages.append({"role": "tool", "tool_call_id": call.id, "content": observation})
    return 0


def anthropic_loop(task: str, model: str, steps: int, timeout: float) -> int:
    """The same loop on the Messages API (tool_use / tool_result blocks)."""
    from anthropic import Anthropic

    client = Anthropic()
    tools = [
        {"name": f["name"], "description": f["description"], "input_schema": f["parameters"]} for f in (BASH, SUBMIT)
    ]
    messages: list[dict] = [{"role": "user", "content": task}]
    for _ in range(steps):
        reply = client.messages.create(model=model, max_tokens=1024, system=SYSTEM, messages=messages, tools=tools)
        messages.append(
            {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in reply.content]}
        )
        uses = [block for block in reply.content if block.type == "tool_use"]
        if not uses:
            return 0
        results = []
        for use in uses:
            observation = act(use.name, dict(use.input or {}), timeout)
            if observation is None:
                return 0
            results.append({"type": "tool_result", "tool_use_id": use.id, "content": observation})
        messages.append({"role": "user", "content": results})
    return 0


def main(argv: list[str] | None = None) -> int:
    """Read the task, run the loop on the chosen API."""
    parser = argparse.ArgumentParser(prog="raas-openai-agent")
    parser.add_argument("--task-file", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--api", choices=["openai", "anthropic"], default="openai")
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--tool-timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    with open(args.task_file) as handle:
        task = handle.read()
    loop = anthropic_loop if args.api == "anthropic" else openai_loop
    return loop(task, args.model, args.max_steps, args.tool_timeout)


if __name__ == "__main__":
    sys.exit(main())
