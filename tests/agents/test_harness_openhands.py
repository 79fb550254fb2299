"""OpenHands (PyPI `openhands-sdk` + `openhands-tools`), unmodified, end to end (issue 36):
gateway, Celery workers, bwrap, HTTP.

The `openhands` preset (`core.harness_presets`) runs the SDK's `Agent` with its terminal and
file-editor tools in a local conversation on the rollout's workspace (the launcher,
`core/harness_launchers/harness_openhands`, configures nothing of it). The SDK needs Python
>= 3.12: the preset names `python = "3.12"`, the environment is a venv of the node's 3.12
(pyenv's here), and its base install is bound read-only into the sandbox beside the
environment. The network is off: it reaches only its rollout's endpoint (OpenAI Chat, not
streamed, through LiteLLM with its bundled price list).

The LLM simulator (a fake vLLM, named as such) is scripted in the Qwen-style `<tool_call>`
format the endpoint parses, with the tools and arguments OpenHands offers (its first real
request: tests/fixtures/harness-requests/openhands.json): the fix links the workspace at an
absolute path (the file editor takes only absolute ones), replaces the buggy line with
`file_editor` `str_replace`, and calls `finish`; the no-op looks and finishes. The fix earns 1
from the swe EVAL, the no-op 0.
"""

from __future__ import annotations

import json
import time

import pytest

from fakellm.server import start_simulator
from tests.agents.test_harness_pipeline import (
    INTERVALS,
    QWEN_TEMPLATE,
    SLUGIFY,
    SMOLLM2,
    SWE,
    as_instance,
    call,
    statement,
)
from bench.support.pipeline_harness import start_service
from raas_client.models import RolloutView

# A whole-service tier; the first run on a machine also builds OpenHands' environment (pip
# into a 3.12 venv: ~190 packages, ~660 MB, about 3 minutes here).
pytestmark = [pytest.mark.service, pytest.mark.timeout(1200)]

MARKER = "[openhands] "
LINK = 'ln -s "$PWD" /tmp/ws && ls /tmp/ws/intervals'
EDIT = dict(
    command="str_replace",
    path="/tmp/ws/intervals/core.py",
    old_str="            merged[-1][1] = end\n",
    new_str="            merged[-1][1] = max(merged[-1][1], end)\n",
)
SCRIPT = {  # the turn: assistant turns so far (the default marker)
    "by_instance": {
        MARKER + statement(INTERVALS): [
            call("terminal", command=LINK, summary="link the workspace"),
            call("file_editor", **EDIT, summary="keep the larger end"),
            call("finish", message="merge() keeps the larger end now."),
        ],
        MARKER + statement(SLUGIFY): [
            call("terminal", command="ls", summary="look around"),
            call("finish", message="Nothing to change."),
        ],
    },
}


def marked(instance_id: str) -> dict:
    row = as_instance(instance_id, SWE)
    row["data"]["problem_statement"] = MARKER + row["data"]["problem_statement"]
    return row


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """One service, the environments built as `raas env build` does (once per machine)."""
    from core.harnesses import default_harnesses
    from sandbox.environments import build_environment
    from sandbox.pythons import PythonMissing, find_python

    preset = default_harnesses()["openhands"]
    try:
        find_python(preset.python)
    except PythonMissing as exc:
        pytest.skip(f"OpenHands needs Python {preset.python}: {exc}")
    home = tmp_path_factory.mktemp("openhands-service")
    (home / "envs").mkdir()
    (home / "envs" / "pytest").symlink_to(build_environment("pytest", ["pytest"]))  # the swe EVAL's
    started = time.monotonic()
    env = build_environment("harness-openhands", preset.packages, python=preset.python)
    print(f"\nopenhands environment {env}: {time.monotonic() - started:.0f} s (0 when built before)")
    (home / "envs" / "openhands").symlink_to(env)
    svc = start_service(home, concurrency=2)
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def llm():
    url, stop = start_simulator(SMOLLM2, SCRIPT)
    # its first request: a ~20 kB system prompt and four tools' schemas
    yield {"servers": [{"url": url}], "tokenizer": SMOLLM2, "max_model_len": 32768, "chat_template_text": QWEN_TEMPLATE}
    stop()


def counts(rollout: RolloutView) -> dict[str, int]:
    """What the endpoint counted for one rollout (parse failures: `malformed_tool_calls`)."""
    keys = ("calls", "samples", "merges", "splits", "malformed_tool_calls", "tool_calls", "failed_calls")
    return {k: rollout.metrics[k] for k in keys}


def test_openhands_fixes_a_bug_with_its_file_editor_and_the_no_op_earns_nothing(service, llm) -> None:
    job = service.client.submit(
        "harness",
        [marked(INTERVALS), marked(SLUGIFY)],
        llm=llm,
        sampling={"max_tokens": 512},
        agent_config={"harness": "openhands", "task": "swe"},
    )
    service.wait_done(job.job_id, timeout=900)
    done = {r.instance_id: service.client.rollout(r.rollout_id) for r in service.all_results(job.job_id)}
    for instance, rollout in sorted(done.items()):
        seconds = rollout.metrics.get("harness_seconds")
        print(f"\nopenhands {instance}: reward {rollout.reward} {json.dumps(counts(rollout))} harness {seconds} s")
        if rollout.outcome != "completed":
            print(rollout.extra.get("harness_log", "")[-4000:])
    logs = {i: r.extra.get("harness_log", "")[-3000:] for i, r in done.items()}
    got = {i: (r.outcome, r.reward) for i, r in done.items()}
    assert got == {INTERVALS: ("completed", 1.0), SLUGIFY: ("completed", 0.0)}, (logs, service.log_tail())

    fixed, no_op = done[INTERVALS], done[SLUGIFY]
    patch = fixed.extra["git_patch"]
    assert "max(merged[-1][1], end)" in patch and ".openhands" not in patch, patch  # its state in HOME
    assert fixed.metrics["harness_returncode"] == 0 and no_op.metrics["harness_returncode"] == 0
    # nothing tried to leave the sandbox (LiteLLM's price list, telemetry)
    for log in (fixed.extra["harness_log"], no_op.extra["harness_log"]):
        assert "Failed to resolve" not in log and "Max retries exceeded" not in log, log
    # every reply a tool call the endpoint parsed; OpenHands re-sends its history as it got it
    assert counts(fixed) == dict(
        calls=3, samples=1, merges=2, splits=0, malformed_tool_calls=0, tool_calls=3, failed_calls=0
    ), fixed.metrics
    assert counts(no_op) == dict(
        calls=2, samples=1, merges=1, splits=0, malformed_tool_calls=0, tool_calls=2, failed_calls=0
    ), no_op.metrics
    # the work was real: the tool calls are the sample's generated tokens, masked for training
    turns = sorted(fixed.turns, key=lambda t: t.index)
    called = [json.loads(t.text.split("<tool_call>")[1].split("</tool_call>")[0])["name"] for t in turns]
    assert called == ["terminal", "file_editor", "finish"]
    assert sum(fixed.loss_mask) == sum(len(t.generated_ids) for t in turns) > 0
    # the edit was its file editor's (the terminal only linked the workspace)
    assert "[File /tmp/ws/intervals/core.py edited with 1 changes.]" in fixed.extra["harness_log"]
