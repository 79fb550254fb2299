"""aider (PyPI `aider-chat`), unmodified, end to end (issue 36): gateway, Celery workers, bwrap, HTTP.

The `aider` preset (`core.harness_presets`) runs aider's own CLI, one headless message, from
its real package in a sandbox environment built with the system python, the network off: it
reaches only its rollout's endpoint (OpenAI Chat, through LiteLLM, streamed). aider offers no
tools: it reads edits out of the reply text, as SEARCH/REPLACE blocks. So the LLM simulator (a
fake vLLM, named as such) is scripted in aider's own way of working: the first reply names the
file to change, aider (--yes-always) adds it to the chat and asks again with the file's text,
the second reply is a SEARCH/REPLACE block that aider applies in the workspace. The fixed
rollout earns 1 from the swe EVAL, the no-op (a reply with no edit) earns 0. aider rewrites its
history between the two calls (the files' text goes in before the task, the edit rules leave
the task's message): the fixed rollout is two samples, one split.
"""

from __future__ import annotations

import json

import pytest

from fakellm.server import start_simulator
from tests.agents.test_harness_pipeline import INTERVALS, QWEN_TEMPLATE, SLUGIFY, SMOLLM2, SWE, as_instance, statement
from bench.support.pipeline_harness import start_service
from raas_client.models import RolloutView

# A whole-service tier; the first run on a machine also builds aider's environment (pip:
# ~100 packages, ~700 MB, 1.5-2 minutes here).
pytestmark = [pytest.mark.service, pytest.mark.timeout(900)]

MARKER = "[aider] "
ASK = "To fix this I need to change `merge()` in intervals/core.py."
EDIT = """intervals/core.py
```python
<<<<<<< SEARCH
            merged[-1][1] = end
=======
            merged[-1][1] = max(merged[-1][1], end)
>>>>>>> REPLACE
```
"""
NO_OP = "The code already does what the issue asks; nothing needs to change."
# Which reply: the first key (in this order) found in the prompt. aider's own message after it
# added the file is found only in the fixed rollout's second call (aider sends example
# conversations and its repo map as turns of their own, so turns are not counted here).
SCRIPT = {
    "by_instance": {
        "I added these files to the chat: intervals/core.py": [EDIT],
        MARKER + statement(INTERVALS): [ASK],
        MARKER + statement(SLUGIFY): [NO_OP],
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

    home = tmp_path_factory.mktemp("aider-service")
    (home / "envs").mkdir()
    (home / "envs" / "pytest").symlink_to(build_environment("pytest", ["pytest"]))  # the swe EVAL's
    (home / "envs" / "aider").symlink_to(build_environment("harness-aider", default_harnesses()["aider"].packages))
    svc = start_service(home, concurrency=2)
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def llm():
    url, stop = start_simulator(SMOLLM2, SCRIPT)
    # aider's first request: its system prompt, two example exchanges, the repo map, the task
    yield {"servers": [{"url": url}], "tokenizer": SMOLLM2, "max_model_len": 32768, "chat_template_text": QWEN_TEMPLATE}
    stop()


def counts(rollout: RolloutView) -> dict[str, int]:
    """What the endpoint counted for one rollout (parse failures: `malformed_tool_calls`)."""
    keys = ("calls", "samples", "merges", "splits", "malformed_tool_calls", "tool_calls", "failed_calls")
    return {k: rollout.metrics[k] for k in keys}


def test_aider_fixes_a_bug_with_a_search_replace_block_and_the_no_op_earns_nothing(service, llm) -> None:
    job = service.client.submit(
        "harness",
        [marked(INTERVALS), marked(SLUGIFY)],
        llm=llm,
        sampling={"max_tokens": 512},
        agent_config={"harness": "aider", "task": "swe"},
    )
    service.wait_done(job.job_id, timeout=600)
    done = {r.instance_id: service.client.rollout(r.rollout_id) for r in service.all_results(job.job_id)}
    for instance, rollout in sorted(done.items()):
        seconds = rollout.metrics["harness_seconds"]
        print(f"\naider {instance}: reward {rollout.reward} {json.dumps(counts(rollout))} harness {seconds} s")
    logs = {i: r.extra.get("harness_log", "")[-2000:] for i, r in done.items()}
    got = {i: (r.outcome, r.reward) for i, r in done.items()}
    assert got == {INTERVALS: ("completed", 1.0), SLUGIFY: ("completed", 0.0)}, (logs, service.log_tail())

    fixed, no_op = done[INTERVALS], done[SLUGIFY]
    assert "max(merged[-1][1], end)" in fixed.extra["git_patch"]
    # aider's files stay out of the diff: its histories in HOME, its repo map's tag cache skipped
    assert ".aider" not in fixed.extra["git_patch"] and ".gitignore" not in fixed.extra["git_patch"]
    assert fixed.metrics["harness_returncode"] == 0 and no_op.metrics["harness_returncode"] == 0
    assert "Applied edit to intervals/core.py" in fixed.extra["harness_log"], logs[INTERVALS]
    # nothing tried to leave the sandbox (LiteLLM's price list, PyPI's version, analytics)
    for log in (fixed.extra["harness_log"], no_op.extra["harness_log"]):
        assert "Failed to resolve" not in log and "Max retries exceeded" not in log, log
    # two calls, text only (aider offers no tools); its history rewrite between them is a split
    assert counts(fixed) == dict(
        calls=2, samples=2, merges=0, splits=1, malformed_tool_calls=0, tool_calls=0, failed_calls=0
    ), fixed.metrics
    assert counts(no_op) == dict(
        calls=1, samples=1, merges=0, splits=0, malformed_tool_calls=0, tool_calls=0, failed_calls=0
    ), no_op.metrics
    assert set(fixed.metrics["split_reasons"]) <= {"history_rewritten", "assistant_edited"}, fixed.metrics
    assert fixed.metrics["streamed_calls"] == 2, fixed.metrics  # aider streams by default
    # the work was real: the last sample's generated tokens are the edit, masked for training
    last = max(fixed.turns, key=lambda t: t.index)
    assert sum(fixed.loss_mask) == len(last.generated_ids) > 0
    assert "<<<<<<< SEARCH" in last.text
    assert [s.calls for s in fixed.samples] == [1, 1], fixed.samples
    print(f"aider split reasons: {fixed.metrics['split_reasons']}")
