"""Real harnesses, unmodified, end to end (issue 23): gateway, Celery workers, bwrap, HTTP.

mini-swe-agent (PyPI, through LiteLLM) and the example agent on the official `openai` SDK
(and its `anthropic` SDK path) run in sandbox environments built with the system python,
with the network off, and reach only their rollout's endpoint through the loopback relay.
The LLM simulator (a fake vLLM, named as such) is scripted to act through each harness's own
format: a `bash` tool call that fixes the bug, then the harness's way to stop (mini's
`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`, the example's `submit`). The fixed rollout
earns reward 1 from the swe EVAL (its diff, graded in a fresh sandbox), the no-op earns 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.harnesses import EXAMPLE_AGENT
from fakellm.server import start_simulator
from bench.support.pipeline_harness import start_service
from raas_client.models import JobAccepted

# A whole-service tier: `make test`, not `make test-fast`. The first test also waits for the
# environments' first build on a machine (pip: minutes on a loaded one) and for its job among
# all the file's jobs, so the file's tests get more than the suite's 300 s.
pytestmark = [pytest.mark.service, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
SMOLLM2 = str(FIXTURES / "smollm2-tokenizer")
QWEN_TEMPLATE = (FIXTURES / "qwen-style-template" / "chat_template.jinja").read_text()
SWE = {
    json.loads(line)["instance_id"]: json.loads(line)
    for line in (REPO / "examples/swe/instances.jsonl").read_text().splitlines()
}
MATH = {
    json.loads(line)["instance_id"]: json.loads(line)
    for line in (REPO / "examples/math.jsonl").read_text().splitlines()
}
INTERVALS, SLUGIFY, MONEY = (f"raas-examples__{n}-1" for n in ("intervals", "slugify", "money"))
MATH_ID = "math-001"
ENVS = {
    "pytest": ["pytest"],  # the swe EVAL's environment (built on first use otherwise)
    "openai-agent": ["openai", "anthropic", "pytest", EXAMPLE_AGENT],
    "mini-swe-agent": ["mini-swe-agent", "pytest"],
}
FIX = (
    "python3 -c \"import pathlib; p = pathlib.Path('intervals/core.py'); "
    "p.write_text(p.read_text().replace('merged[-1][1] = end\\n', "
    "'merged[-1][1] = max(merged[-1][1], end)\\n'))\""
)
MINI_SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def call(name: str, **arguments: Any) -> str:
    """A reply in the model's own tool-call format (the endpoint parses it for the harness)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def as_instance(instance_id: str, source: dict) -> dict:
    return {"instance_id": instance_id, "data": {k: v for k, v in source[instance_id].items() if k != "instance_id"}}


def statement(instance_id: str) -> str:
    return SWE[instance_id]["problem_statement"].strip().splitlines()[0]


# Both harnesses expose one `bash` tool taking `command`; they differ in how they stop.
SCRIPT = {
    "turn_marker": "<|im_start|>user",  # a turn per user/tool turn: a harness may drop
    # its own replies from the history (mini-swe-agent does with a cut one)
    "by_instance": {
        # mini-swe-agent drops a reply cut at max_tokens from the history it sends next: a split
        "[mini-split] " + statement(INTERVALS): [
            {"text": "word " * 700},
            call("bash", command=FIX),
            call("bash", command=MINI_SUBMIT),
        ],
        # the mini-swe-agent rollouts carry this marker in their task (see `mini_task`)
        "[mini] " + statement(INTERVALS): [call("bash", command=FIX), call("bash", command=MINI_SUBMIT)],
        "[mini] " + statement(SLUGIFY): [call("bash", command="ls"), call("bash", command=MINI_SUBMIT)],
        statement(INTERVALS): [call("bash", command=FIX), call("submit")],
        statement(SLUGIFY): [call("bash", command="ls"), call("submit")],
        statement(MONEY): [call("bash", command="kill -9 $PPID")],  # the harness dies mid-run
        "positive divisors of 360": [call("bash", command="echo 1170 > answer.txt"), call("submit")],
    },
}


@pytest.fixture(scope="module")
def built() -> dict[str, str]:
    """The harness environments, built once per machine (`raas env build` does the same)."""
    from sandbox.environments import build_environment

    return {
        name: str(build_environment(name if name == "pytest" else f"harness-{name}", packages))
        for name, packages in ENVS.items()
    }


@pytest.fixture(scope="module")
def service(tmp_path_factory, built):
    """One service (gateway, pools, reaper) for the whole file: every test's job runs on it."""
    home = tmp_path_factory.mktemp("harness-service")
    envs = home / "envs"  # the service home's environments: the registrations' names
    envs.mkdir()
    for name, path in built.items():
        (envs / name).symlink_to(path)
    svc = start_service(home, concurrency=2)
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def llm():
    """One simulator for the file: its script picks the reply by the prompt's task, not by
    request order, so the jobs can share it (and run at once)."""
    url, stop = start_simulator(SMOLLM2, SCRIPT)
    yield {"servers": [{"url": url}], "tokenizer": SMOLLM2, "max_model_len": 8192, "chat_template_text": QWEN_TEMPLATE}
    stop()


def outcomes(service, job: JobAccepted) -> dict[str, tuple[str | None, float | None]]:
    service.wait_done(job.job_id, timeout=300)
    return {r.instance_id: (r.outcome, r.reward) for r in service.all_results(job.job_id)}


def submit(service, llm, harness: str, task: str, instances: list[dict], **config) -> JobAccepted:
    return service.client.submit(
        "harness",
        instances,
        llm=llm,
        sampling={"max_tokens": 512},
        agent_config={"harness": harness, "task": task, **config},
    )


def marked(instance_id: str, marker: str) -> dict:
    """The instance with `marker` before its task: the script's key for that harness's replies."""
    row = as_instance(instance_id, SWE)
    row["data"]["problem_statement"] = marker + row["data"]["problem_statement"]
    return row


# Every job of the file, submitted at once when the first test asks (the pools work on them
# together, two rollouts per stage; each test then waits for and checks its own).
JOBS = {
    "openai-swe": ("openai-agent", "swe", lambda: [as_instance(i, SWE) for i in (INTERVALS, SLUGIFY)]),
    "openai-math": ("openai-agent", "math", lambda: [as_instance(MATH_ID, MATH)]),
    "anthropic-swe": ("anthropic-agent", "swe", lambda: [as_instance(INTERVALS, SWE)]),
    "mini-swe": ("mini-swe-agent", "swe", lambda: [marked(i, "[mini] ") for i in (INTERVALS, SLUGIFY)]),
    "mini-split": ("mini-swe-agent", "swe", lambda: [marked(INTERVALS, "[mini-split] ")]),
    "openai-crash": ("openai-agent", "swe", lambda: [as_instance(MONEY, SWE)]),
}


@pytest.fixture(scope="module")
def jobs(service, llm) -> dict[str, JobAccepted]:
    """The submitted jobs of `JOBS`, by name."""
    return {name: submit(service, llm, harness, task, instances()) for name, (harness, task, instances) in JOBS.items()}


def test_the_openai_sdk_agent_fixes_a_bug_and_the_no_op_earns_nothing(service, jobs) -> None:
    job = jobs["openai-swe"]
    assert outcomes(service, job) == {INTERVALS: ("completed", 1.0), SLUGIFY: ("completed", 0.0)}, service.log_tail()
    by_id = {r.instance_id: r for r in service.all_results(job.job_id)}
    fixed = service.client.rollout(by_id[INTERVALS].rollout_id)
    assert "max(merged[-1][1], end)" in fixed.extra["git_patch"]
    assert fixed.metrics["calls"] == 2 and fixed.metrics["tool_calls"] == 2
    assert fixed.metrics["harness_returncode"] == 0 and fixed.finish_reason == "finish"
    # the work was real: two generated turns, their tokens masked 1, the observation 0
    assert sum(fixed.loss_mask) > 0 and 0 in fixed.loss_mask
    assert len(fixed.turns) == 2
    # re-evaluation grades the stored artifact again, with the task kind's EVAL
    again = service.client.reevaluate(by_id[INTERVALS].rollout_id, wait=120)
    assert again.extra["reevaluations"][0]["reward"] == 1.0


def test_the_openai_sdk_agent_answers_a_math_problem_in_its_answer_file(service, jobs) -> None:
    job = jobs["openai-math"]
    assert outcomes(service, job) == {MATH_ID: ("completed", 1.0)}, service.log_tail()
    [row] = service.all_results(job.job_id)
    assert service.client.rollout(row.rollout_id).extra["predicted_answer"] == "1170"


def test_the_anthropic_sdk_path_fixes_the_bug(service, jobs) -> None:
    job = jobs["anthropic-swe"]
    assert outcomes(service, job) == {INTERVALS: ("completed", 1.0)}, service.log_tail()


def test_mini_swe_agent_unmodified_fixes_a_bug_and_the_no_op_earns_nothing(service, jobs) -> None:
    job = jobs["mini-swe"]
    assert outcomes(service, job) == {INTERVALS: ("completed", 1.0), SLUGIFY: ("completed", 0.0)}, service.log_tail()
    by_id = {r.instance_id: r for r in service.all_results(job.job_id)}
    fixed = service.client.rollout(by_id[INTERVALS].rollout_id)
    assert fixed.metrics["calls"] == 2 and fixed.metrics["harness_returncode"] == 0
    assert "max(merged[-1][1], end)" in fixed.extra["git_patch"]
    assert (fixed.metrics["samples"], fixed.metrics["merges"]) == (1, 1)


def test_mini_swe_agent_rewriting_its_history_splits_into_samples(service, jobs) -> None:
    """Its first reply is cut at max_tokens without a tool call; mini-swe-agent then sends a
    history without that reply (a rewrite): two prefix-consistent samples, still reward 1."""
    job = jobs["mini-split"]
    assert outcomes(service, job) == {INTERVALS: ("completed", 1.0)}, service.log_tail()
    [result] = service.all_results(job.job_id)
    rollout = service.client.rollout(result.rollout_id)
    metrics = rollout.metrics
    assert (metrics["calls"], metrics["samples"], metrics["splits"]) == (3, 2, 1), metrics
    assert metrics["split_reasons"] == {"history_rewritten": 1}
    first, second = rollout.samples
    cut, fix, submit_call = sorted(rollout.turns, key=lambda t: t.index)
    assert cut.finish_reason == "turn_length" and first.response_ids == cut.generated_ids
    assert second.split_reason == "history_rewritten"
    # the second sample: the rewritten prompt, the fix, the observation, the submit
    spans = second.turn_boundaries
    assert [second.response_ids[a:b] for a, b in spans] == [fix.generated_ids, submit_call.generated_ids]
    assert second.prompt_ids == fix.extra["prompt_ids"]
    assert rollout.response_ids == second.response_ids  # the main arrays: the last one


def test_a_harness_that_crashes_is_an_agent_error_graded_zero(service, jobs) -> None:
    """The model's command kills the harness (SIGKILL to the agent process): its own crash."""
    job = jobs["openai-crash"]
    assert outcomes(service, job) == {MONEY: ("agent_error", 0.0)}, service.log_tail()
    [row] = service.all_results(job.job_id)
    rollout = service.client.rollout(row.rollout_id)
    assert rollout.finish_reason == "harness_exit"
    assert rollout.metrics["harness_returncode"] == -9 and rollout.metrics["calls"] == 1
    assert len(rollout.turns) == 1 and sum(rollout.loss_mask) > 0  # the call is kept


@pytest.mark.parametrize(
    "config, field",
    [
        ({"harness": "no-such", "task": "swe"}, "agent_config.harness"),
        ({"harness": "../bin/sh", "task": "swe"}, "agent_config.harness"),
        ({"harness": "mini-swe-agent", "task": "math"}, "agent_config.task"),
        ({"harness": "openai-agent", "task": "swe", "command": ["sh"]}, "agent_config"),
        ({"harness": "openai-agent", "task": "swe", "task_config": {"test_timeout": -1}}, "agent_config"),
    ],
)
def test_a_job_only_names_a_registered_harness(service, llm, config, field) -> None:
    import httpx

    response = httpx.post(
        f"{service.url}/v1/jobs",
        json={"agent": "harness", "instances": [as_instance(INTERVALS, SWE)], "llm": llm, "agent_config": config},
    )
    assert response.status_code == 400, response.text
    assert field in response.text


def test_a_harness_instance_is_checked_as_its_task_kind(service, llm) -> None:
    import httpx

    response = httpx.post(
        f"{service.url}/v1/jobs",
        json={
            "agent": "harness",
            "instances": [{"instance_id": "x", "data": {"repo": "r"}}],
            "llm": llm,
            "agent_config": {"harness": "openai-agent", "task": "swe"},
        },
    )
    assert response.status_code == 400 and "instance.base_commit" in response.text
