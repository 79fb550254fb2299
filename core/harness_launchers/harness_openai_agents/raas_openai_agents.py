"""The OpenAI Agents SDK (`openai-agents`), its default model, one `bash` function tool.

The launcher does what a user of the SDK writes to run an agent: it reads the task from a
file, points the SDK's default OpenAI client at `OPENAI_BASE_URL`/`OPENAI_API_KEY`, builds an
`Agent` with one tool and calls `Runner.run_sync`. The model is the SDK's default
`OpenAIResponsesModel`, so every call is an OpenAI Responses request (`/v1/responses`, the full
input each time). Tracing is off: it would post to api.openai.com. Install it into a sandbox
environment with
`raas env build openai-agents --package openai-agents --package <raas>/core/harness_launchers/harness_openai_agents`.
"""

from __future__ import annotations

import argparse
import os
import subprocess

import agents  # the SDK's import name (raas's own `agents` package is not in the sandbox)
from openai import AsyncOpenAI

OUTPUT_CHARS = 10_000
INSTRUCTIONS = "You are a software engineer. Use the bash tool to inspect and change files; reply when done."


def bash_tool(timeout: float) -> agents.FunctionTool:
    """One bash command in the current directory: its output and exit code."""

    @agents.function_tool
    def bash(command: str) -> str:
        """Run a bash command in the current directory; returns its output and exit code."""
        try:
            done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"[timed out after {timeout:g}s]"
        return f"{(done.stdout + done.stderr)[-OUTPUT_CHARS:]}\n[exit code {done.returncode}]"

    return bash


def main() -> int:
    """`raas-openai-agents --task-file FILE --model NAME`: run the agent on the task, exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task-file", required=True)
    parser.add_argument("--model", default="raas")
    parser.add_argument("--max-turns", type=int, default=30)
    parser.add_argument("--tool-timeout", type=float, default=120.0)
    args = parser.parse_args()
    with open(args.task_file, encoding="utf-8") as handle:
        task = handle.read()
    agents.set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=os.environ.get("OPENAI_BASE_URL"), api_key=os.environ.get("OPENAI_API_KEY"))
    agents.set_default_openai_client(client, use_for_tracing=False)
    agent = agents.Agent(name="raas", instructions=INSTRUCTIONS, tools=[bash_tool(args.tool_timeout)], model=args.model)
    result = agents.Runner.run_sync(agent, task, max_turns=args.max_turns)
    print(result.final_output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
