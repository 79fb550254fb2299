"""The OpenHands SDK's `Agent` with its standard terminal and file-editor tools, headless.

The launcher only does what a user of the SDK writes to run it (its "hello world"): an `LLM`
on the OpenAI-compatible endpoint (`openai/<model>` through LiteLLM, `base_url` and `api_key`
from `OPENAI_BASE_URL`/`OPENAI_API_KEY`), an `Agent` with `TerminalTool` and `FileEditorTool`
(the SDK adds its built-in `finish` and `think`), a local `Conversation` whose workspace is the
current directory (the rollout's), then `send_message(task)` and `run()`. Nothing of the agent
is configured: its system prompt, tool schemas, condenser defaults and stuck detection are
its own. Its state goes to HOME (`OH_PERSISTENCE_DIR`, the conversation's folder), never to the
workspace. Install it into a Python >= 3.12 sandbox environment with
`raas env build openhands --python 3.12 --package openhands-sdk==V --package openhands-tools==V
--package <raas>/core/harness_launchers/harness_openhands`.
"""

from __future__ import annotations

import argparse
import os

from openhands.sdk import LLM, Agent, Conversation, Tool
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.terminal import TerminalTool


def main() -> int:
    """`raas-openhands --task-file FILE --model NAME`: run the agent on the task, exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task-file", required=True)
    parser.add_argument("--model", default="raas")
    parser.add_argument("--state-dir", default=os.path.expanduser("~/.openhands/conversations"))
    args = parser.parse_args()
    with open(args.task_file, encoding="utf-8") as handle:
        task = handle.read()
    llm = LLM(
        model=f"openai/{args.model}",
        base_url=os.environ.get("OPENAI_BASE_URL"),
        api_key=os.environ.get("OPENAI_API_KEY"),
        usage_id="agent",
    )
    agent = Agent(llm=llm, tools=[Tool(name=TerminalTool.name), Tool(name=FileEditorTool.name)])
    conversation = Conversation(agent=agent, workspace=os.getcwd(), persistence_dir=args.state_dir)
    conversation.send_message(task)
    conversation.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
