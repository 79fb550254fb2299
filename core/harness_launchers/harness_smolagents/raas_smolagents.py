"""smolagents' `ToolCallingAgent` + `OpenAIServerModel`, every default kept, one `bash` tool.

The launcher only does what a user of smolagents writes to run it: it reads the task from a
file, builds the model from `OPENAI_BASE_URL`/`OPENAI_API_KEY` and the agent with one tool,
and calls `agent.run(task)`. Nothing of smolagents is configured: its requests are its own
(`tool_choice: "required"`, `stop: ["Observation:", "Calling tools:"]`, its history rendering,
its `final_answer` tool, 20 steps). Install it into a sandbox environment with
`raas env build smolagents --package smolagents --package <raas>/core/harness_launchers/harness_smolagents`.
"""

from __future__ import annotations

import argparse
import os
import subprocess

from smolagents import OpenAIServerModel, Tool, ToolCallingAgent

OUTPUT_CHARS = 10_000


class BashTool(Tool):
    """One bash command in the current directory: its output and exit code."""

    name = "bash"
    description = "Run a bash command in the current directory; returns its output and exit code."
    inputs = {"command": {"type": "string", "description": "The bash command to run"}}
    output_type = "string"

    def __init__(self, timeout: float = 120.0) -> None:
        super().__init__()
        self.timeout = timeout

    def forward(self, command: str) -> str:
        try:
            done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            return f"[timed out after {self.timeout:g}s]"
        return f"{(done.stdout + done.stderr)[-OUTPUT_CHARS:]}\n[exit code {done.returncode}]"


def main() -> int:
    """`raas-smolagents --task-file FILE --model NAME`: run the agent on the task, exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task-file", required=True)
    parser.add_argument("--model", default="raas")
    parser.add_argument("--tool-timeout", type=float, default=120.0)
    args = parser.parse_args()
    with open(args.task_file, encoding="utf-8") as handle:
        task = handle.read()
    model = OpenAIServerModel(
        model_id=args.model, api_base=os.environ.get("OPENAI_BASE_URL"), api_key=os.environ.get("OPENAI_API_KEY")
    )
    agent = ToolCallingAgent(tools=[BashTool(args.tool_timeout)], model=model)
    print(agent.run(task))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
