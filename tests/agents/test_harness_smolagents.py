"""smolagents' `ToolCallingAgent` with all its defaults, unmodified, end to end (issue 36).

smolagents (from PyPI) and its launcher (`core/harness_launchers/harness_smolagents`: `OpenAIServerModel` +
`ToolCallingAgent`, one bash tool, nothing configured) run in a sandbox environment built with
the system python, through gateway, Celery workers, bwrap and HTTP. smolagents sends
`tool_choice: "required"` and `stop: ["Observation:", "Calling tools:"]` on every call and
re-renders its history (a tool call becomes the assistant text "Calling tools: [...]"): the
endpoint accepts all of it. The LLM simulator (a fake vLLM, named as such; it honours `stop`
as vLLM does) is scripted in the Qwen-style `<tool_call>` format: a `bash` call, then
smolagents' own `final_answer`. The fixed rollout earns 1, the no-op 0; a reply without a
tool call (and with a stop string in it) is answered as text, counted `tool_choice_unmet`,
and smolagents carries on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.harnesses import SMOLAGENTS_LAUNCHER
from fakellm.server import start_simulator
from bench.support.pipeline_harness import start_service
from raas_client.models import JobAccepted, RolloutView

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
    "smolagents": ["smolagents", "openai", "pytest", SMOLAGENTS_LAUNCHER],
}
FIX = (
    "python3 -c \"import pathlib; p = pathlib.Path('intervals/core.py'); "
    "p.write_text(p.read_text().replace('merged[-1][1] = end\\n', "
    "'merged[-1][1] = max(merged[-1][1], end)\\n'))\""
)
# A reply without a tool call, with one of smolagents' stop strings in it: the server stops
# there, smolagents gets the text before it, fails to find a call in it and asks again.
PONDER = "Thought: the merge keeps the wrong end.\nObservation: I should edit core.py next."


def call(name: str, **arguments: Any) -> str:
    """A reply in the model's own tool-call format (the endpoint parses it for the harness)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def statement(instance_id: str) -> str:
    return SWE[instance_id]["problem_statement"].strip().splitlines()[0]


def marked(instance_id: str, marker: str) -> dict:
    """The instance with `marker` before its task: the script's key for its replies."""
    data = {k: v for k, v in SWE[instance_id].items() if k != "instance_id"}
    data["problem_statement"] = marker + data["problem_statement"]
    return {"instance_id": instance_id, "data": data}


SCRIPT = {
    "turn_marker": "<|im_start|>user",  # smolagents sends observations and errors as user turns
    "by_instance": {
        "[ponder] " + statement(INTERVALS): [PONDER, call("bash", command=FIX), call("final_answer", answer="fixed")],
        "[smol] " + statement(INTERVALS): [call("bash", command=FIX), call("final_answer", answer="fixed")],
        "[smol] " + statement(SLUGIFY): [call("bash", command="ls"), call("final_answer", answer="done")],
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
    home = tmp_path_factory.mktemp("smolagents-service")
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


@pytest.fixture(scope="module")
def jobs(service, llm) -> dict[str, JobAccepted]:
    """Both jobs, submitted at once (the pools work on them together)."""
    instances = {
        "swe": [marked(INTERVALS, "[smol] "), marked(SLUGIFY, "[smol] ")],
        "ponder": [marked(INTERVALS, "[ponder] ")],
    }
    return {
        name: service.client.submit(
            "harness",
            rows,
            llm=llm,
            sampling={"max_tokens": 512},
            agent_config={"harness": "smolagents", "task": "swe"},
        )
        for name, rows in instances.items()
    }


def rollouts(service, job: JobAccepted) -> dict[str, RolloutView]:
    service.wait_done(job.job_id, timeout=600)
    return {r.instance_id: service.client.rollout(r.rollout_id) for r in service.all_results(job.job_id)}


def test_smolagents_defaults_fix_a_bug_and_the_no_op_earns_nothing(service, jobs) -> None:
    done = rollouts(service, jobs["swe"])
    got = {i: (r.outcome, r.reward) for i, r in done.items()}
    assert got == {INTERVALS: ("completed", 1.0), SLUGIFY: ("completed", 0.0)}, service.log_tail()
    fixed = done[INTERVALS]
    assert "max(merged[-1][1], end)" in fixed.extra["git_patch"]
    metrics = fixed.metrics
    assert metrics["harness_returncode"] == 0
    # bash + final_answer: two calls, both tool calls, no refusal, no demanded call missed
    assert (metrics["calls"], metrics["tool_calls"], metrics["failed_calls"]) == (2, 2, 0), metrics
    assert metrics["tool_choice_unmet"] == 0 and metrics["refusals"] == {} and metrics["malformed_tool_calls"] == 0
    # smolagents writes the call back as "Calling tools: [...]" text: a split, each sample
    # prefix-consistent, the main arrays the last one
    assert metrics["samples"] == 2 and metrics["splits"] == 1, metrics
    assert set(metrics["split_reasons"]) <= {"assistant_edited", "history_rewritten"}
    turns = sorted(fixed.turns, key=lambda t: t.index)
    assert [t.extra["tool_choice"] for t in turns] == ["required", "required"]
    assert sum(fixed.loss_mask) == len(turns[-1].generated_ids)
    assert fixed.response_ids[-len(turns[-1].generated_ids) :] == turns[-1].generated_ids


def test_a_reply_without_the_required_call_is_answered_and_counted(service, jobs) -> None:
    [rollout] = rollouts(service, jobs["ponder"]).values()
    assert (rollout.outcome, rollout.reward) == ("completed", 1.0), service.log_tail()
    metrics = rollout.metrics
    assert metrics["tool_choice_unmet"] == 1 and metrics["calls"] == 3, metrics
    first = min(rollout.turns, key=lambda t: t.index)
    # The server stopped at smolagents' "Observation:": the turn holds exactly the ids it
    # returned (through that string's last token, no end token), the text before it went back.
    assert first.extra["stop_sequence"] == "Observation:" and first.finish_reason == "stop"
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(f"{SMOLLM2}/tokenizer.json")
    ids = tok.encode(PONDER, add_special_tokens=False).ids
    through = next(ids[:n] for n in range(1, len(ids) + 1) if "Observation:" in tok.decode(ids[:n]))
    assert first.generated_ids == through
