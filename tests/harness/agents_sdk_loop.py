"""An OpenAI Agents SDK agent, unmodified, run in its own environment (the SDK's import name
`agents` is also raas's): its default `OpenAIResponsesModel` talks to the rollout's endpoint
on the Unix socket in RAAS_SOCKET (streamed when RAAS_STREAM is set). Prints what it ran and
its final output as JSON."""

import asyncio
import importlib
import json
import os

import agents
import openai

agents.set_tracing_disabled(True)  # its tracer would post to api.openai.com
ran = []


@agents.function_tool
def bash(cmd: str) -> str:
    """Run a shell command."""
    ran.append(cmd)
    return f"ran {cmd}"


base = importlib.import_module("openai._base_client")
http = getattr(base, "httpx2", None) or base.httpx
client = openai.AsyncOpenAI(
    base_url="http://rollout/v1",
    api_key=os.environ["RAAS_TOKEN"],
    http_client=http.AsyncClient(transport=http.AsyncHTTPTransport(uds=os.environ["RAAS_SOCKET"]), timeout=30),
    max_retries=0,
)
model = agents.OpenAIResponsesModel(model="policy", openai_client=client)
agent = agents.Agent(name="fixer", instructions="You fix bugs.", tools=[bash], model=model)


async def streamed() -> object:
    """`Runner.run_streamed`, its events consumed as an app would."""
    run = agents.Runner.run_streamed(agent, "Task i-1: fix it.")
    async for _ in run.stream_events():
        pass
    return run


task = "Task i-1: fix it."
result = asyncio.run(streamed() if os.environ.get("RAAS_STREAM") else agents.Runner.run(agent, task))
print(json.dumps({"final_output": result.final_output, "ran": ran}))
