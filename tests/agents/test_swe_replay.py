"""A swe rollout whose sandbox is lost is rebuilt by replay, end to end (issue 41): real gateway,
Celery worker processes, bwrap sandboxes, the reaper, the LLM simulator (a fake vLLM, named as
such) scripted for the `intervals` example.

swe's prompt names the workspace path, and every attempt gets a fresh workspace folder: unless
the new attempt's sandbox shows its workspace at the path the logged turns name
(`tasks.recovery.resume.replayed_workspace`), the rebuilt prompt renders to other tokens than
the logged one, the resume is refused, and the rollout starts over from INIT with every turn
generated again. Here the RUN pool and the sandbox are SIGKILLed (what node loss or `scancel`
does) while turn 2 is generated: attempt 2 replays turns 0-1 into the rebuilt sandbox, its
workspace hash at turn 2 is the uninterrupted run's, the fix lands, reward 1.0, and only the
turn in flight was generated twice.
"""

from __future__ import annotations

import httpx
import pytest

from bench.support.pipeline_harness import start_service
from fakellm.server import start_simulator
from tests.agents.test_replay_pipeline import _turns, lose_node_mid_turn
from tests.agents.test_swe_pipeline import INTERVALS, SMOLLM2, SWE, as_instance, call, statement

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`

HASH = "find . -path ./.git -prune -o -type f -print | sort | xargs sha256sum | sha256sum"
KEY = statement(SWE, INTERVALS)
SCRIPT = {
    "by_instance": {
        KEY: [
            call("bash", command="echo draft > notes.txt && mkdir -p scratch && echo 2 > scratch/two.txt"),
            call("str_replace_editor", command="create", path="scratch/plan.md", file_text="fix the merge\n"),
            # turn 2 takes long enough for the node to be lost while it is generated
            {"text": call("bash", command=HASH), "latency": 3},
            call(
                "str_replace_editor",
                command="str_replace",
                path="intervals/core.py",
                old_str="merged[-1][1] = end\n",
                new_str="merged[-1][1] = max(merged[-1][1], end)\n",
            ),
            call("submit"),
        ]
    }
}


@pytest.fixture(scope="module")
def service(tmp_path_factory, built_env):
    home = tmp_path_factory.mktemp("swe-replay")
    (home / "envs").mkdir()
    (home / "envs" / "pytest").symlink_to(built_env("pytest", ["pytest"]))
    svc = start_service(home, concurrency=2)
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def llm():
    url, stop = start_simulator(SMOLLM2, SCRIPT)
    yield {"servers": [{"url": url}], "tokenizer": SMOLLM2, "max_model_len": 8192}
    stop()


def _stats(llm: dict) -> dict[str, int]:
    return httpx.get(f"{llm['servers'][0]['url']}/sim/stats").json()


def _submit(service, llm) -> tuple[str, str]:
    accepted = service.client.submit(
        "swe", [as_instance(INTERVALS, SWE)], limits={"max_turns": 8, "tool_timeout": 10}, llm=llm
    )
    return accepted.job_id, accepted.rollout_ids[0]


def test_a_lost_swe_sandbox_is_rebuilt_by_replay_at_the_logged_workspace_path(service, llm) -> None:
    job, plain_id = _submit(service, llm)
    service.wait_done(job, timeout=240)
    plain = service.client.rollout(plain_id)
    assert (plain.outcome, plain.reward) == ("completed", 1.0), (plain.error, service.log_tail())
    plain_hash = plain.turns[2].observation
    assert len(plain_hash.split()[0]) == 64, plain_hash

    before = _stats(llm)
    job, rid = _submit(service, llm)
    lose_node_mid_turn(service, rid)
    service.wait_done(job, timeout=240)
    view = service.client.rollout(rid)
    assert (view.outcome, view.reward) == ("completed", 1.0), (view.error, service.log_tail())
    assert view.attempt == 2 and "stopped beating" in view.earlier_attempts[0].error
    assert view.metrics["replayed_turns"] == 2 and view.metrics["replay_divergences"] == []
    assert _turns(service, rid) == [(1, 0), (1, 1), (2, 0), (2, 1), (2, 2), (2, 3), (2, 4)]
    # the rebuilt workspace is the uninterrupted run's at turn 2 (content hash, .git aside), seen
    # at the path the logged turns name
    assert view.turns[2].observation == plain_hash
    logged = view.earlier_attempts[0].turns[0].extra["workspace"]
    assert all(t.extra["workspace"] == logged for t in view.turns)
    assert "max(merged[-1][1], end)" in view.extra["git_patch"]
    answered = _stats(llm)
    per_turn = [answered.get(f"turn:{KEY}:{t}", 0) - before.get(f"turn:{KEY}:{t}", 0) for t in range(5)]
    assert per_turn[:2] == [1, 1]  # the logged turns were never generated again
    assert sum(per_turn) <= 6  # five turns and at most the one in flight
