"""The OpenAI Agents SDK, unmodified, end to end through the Responses dialect (issue 36).

`openai-agents` (PyPI) and its launcher (`core/harness_launchers/harness_openai_agents`: an `Agent` with one
bash function tool on the SDK's default `OpenAIResponsesModel`) run in a sandbox environment
built with the system python, through gateway, Celery workers, bwrap and HTTP: every call is a
`POST /v1/responses` with the whole input (`function_call` and `function_call_output` items
after the first). The LLM simulator (a fake vLLM, named as such) is scripted in the Qwen-style
`<tool_call>` format: a `bash` call, then a plain reply that ends the run. The fixed rollout
earns 1, the no-op 0, and each rollout's calls merge into one training sample.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.harnesses import OPENAI_AGENTS_LAUNCHER
from fakellm.server import start_simulator
from bench.support.pipeline_harness import start_service

pytestmark = [pytest.mark.service, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
SMOLLM2 = str(FIXTURES / "smollm2-tokenizer")
QWEN_TEMPLATE = (FIXTURES / "qwen-style-template" / "chat_template.jinja").read_text()
SWE = {
    json.loads(line)["instance_id"]: json.loads(line)
    for line in (REPO / "examples/swe/instances.jsonl").read_text().splitlines()
}
INTERVALS, SLUGIFY = (f"raas-examples__{n}-1" for n in ("intervals", "slugify"))
ENVS = {
    "pytest": ["pytest"],  # the swe EVAL's environment
    "openai-agents": ["openai-agents", "pytest", OPENAI_AGENTS_LAUNCHER],
}
FIX = (
    "python3 -c \"import pathlib; p = pathlib.Path('intervals/core.py'); "
    "p.write_text(p.read_text().replace('merged[-1][1] = end\\n', "
    "'merged[-1][1] = max(merged[-1][1], end)\\n'))\""
)


def call(name: str, **arguments: Any) -> str:
    """A reply in the model's own tool-call format (the endpoint parses it for the harness)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def statement(instance_id: str) -> str:
    return SWE[instance_id]["problem_statement"].strip().splitlines()[0]


def marked(instance_id: str) -> dict:
    """The instance with a marker before its task: the script's key for its replies."""
    data = {k: v for k, v in SWE[instance_id].items() if k != "instance_id"}
    data["problem_statement"] = "[agents-sdk] " + data["problem_statement"]
    return {"instance_id": instance_id, "data": data}


SCRIPT = {
    "turn_marker": "<|im_start|>user",  # the template renders a tool's output in a user turn
    "by_instance": {
        "[agents-sdk] " + statement(INTERVALS): [call("bash", command=FIX), "Fixed the merge."],
        "[agents-sdk] " + statement(SLUGIFY): [call("bash", command="ls"), "Nothing to change."],
    },
}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """One service for the file, its environments built once per machine (`raas env build`)."""
    from sandbox.environments import build_environment

    built = {
        name: build_environment(name if name == "pytest" else f"harness-{name}", packages)
        for name, packages in ENVS.items()
    }
    home = tmp_path_factory.mktemp("openai-agents-service")
    envs = home / "envs"
    envs.mkdir()
    for name, path in built.items():
        (envs / name).symlink_to(path)
    svc = start_service(home, concurrency=2)
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def llm():
    url, stop = start_simulator(SMOLLM2, SCRIPT)
    yield {"servers": [{"url": url}], "tokenizer": SMOLLM2, "max_model_len": 8192, "chat_template_text": QWEN_TEMPLATE}
    stop()


def test_the_agents_sdk_fixes_a_bug_through_responses_and_the_no_op_earns_nothing(service, llm) -> None:
    job = service.client.submit(
        "harness",
        [marked(INTERVALS), marked(SLUGIFY)],
        llm=llm,
        sampling={"max_tokens": 512},
        agent_config={"harness": "openai-agents", "task": "swe"},
    )
    service.wait_done(job.job_id, timeout=600)
    done = {r.instance_id: service.client.rollout(r.rollout_id) for r in service.all_results(job.job_id)}
    got = {i: (r.outcome, r.reward) for i, r in done.items()}
    assert got == {INTERVALS: ("completed", 1.0), SLUGIFY: ("completed", 0.0)}, service.log_tail()
    fixed = done[INTERVALS]
    assert "max(merged[-1][1], end)" in fixed.extra["git_patch"]
    metrics = fixed.metrics
    assert metrics["harness_returncode"] == 0, fixed.extra.get("harness_log")
    assert (metrics["calls"], metrics["tool_calls"], metrics["failed_calls"]) == (2, 1, 0), metrics
    assert metrics["malformed_tool_calls"] == 0 and metrics["refusals"] == {}, metrics
    # the second call's input is the first's + the reply + the tool's output: one sample
    assert (metrics["samples"], metrics["merges"], metrics["splits"]) == (1, 1, 0), metrics
    turns = sorted(fixed.turns, key=lambda t: t.index)
    assert [t.extra["api"] for t in turns] == ["responses", "responses"], [t.extra for t in turns]
    generated = [i for t in turns for i in t.generated_ids]
    assert sum(fixed.loss_mask) == len(generated)
