"""Branch a swe rollout at turn k, end to end (issue 38): real gateway over HTTP, Celery INIT/
RUN/EVAL worker processes, bwrap sandboxes, the reaper, the LLM simulator (a fake vLLM, named
as such) scripted for the `intervals` example.

The parent edits its workspace (turns 0-1), prints a content hash of it at turn k = 2, prints
it again at turn 3, then does nothing (turn 4) and submits: reward 0. Four branches at turn 2
each resume after the parent's turns 0..2 (replayed into a fresh INIT of the instance, none
generated again), print the hash at their first live turn (it must be the parent's at turn 2),
and the simulator's `variants` give two of them the fix and two a no-op at turn 4: rewards
1, 1, 0, 0, each graded on its own artifact.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from sqlalchemy import select

from core.db import session_scope
from core.models import GroupLayer, Job, Turn
from fakellm.server import start_simulator
from raas_client import RaasHTTPError
from tests.agents.test_swe_pipeline import INTERVALS, SMOLLM2, SWE, as_instance, call, statement
from bench.support.pipeline_harness import start_service

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`

K, M = 2, 4
HASH = "find . -path ./.git -prune -o -type f -print | sort | xargs sha256sum | sha256sum"
FIX = call(
    "str_replace_editor",
    command="str_replace",
    path="intervals/core.py",
    old_str="merged[-1][1] = end\n",
    new_str="merged[-1][1] = max(merged[-1][1], end)\n",
)
NOOP = call("bash", command="ls intervals")
KEY = statement(SWE, INTERVALS)
SCRIPT = {
    "by_instance": {
        KEY: [
            call("bash", command="echo draft > notes.txt && mkdir -p scratch && echo 2 > scratch/two.txt"),
            call("str_replace_editor", command="create", path="scratch/plan.md", file_text="fix the merge\n"),
            call("bash", command=HASH),  # turn K: the parent's workspace as the branches get it
            call("bash", command=HASH),  # each branch's first live turn (the parent's too)
            # the n-th ask of this prompt: the parent first (no-op), then the branches
            {"variants": [NOOP, FIX, FIX, NOOP, NOOP]},
            call("submit"),
        ]
    }
}


@pytest.fixture(scope="module")
def service(tmp_path_factory, built_env):
    home = tmp_path_factory.mktemp("branch-pipeline")
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


def _prefix_length(view) -> int:
    """Response tokens up to where turn K+1's generation starts (turn K's observation included)."""
    return view.extra["turn_boundaries"][K + 1][0]


def test_branches_resume_the_parents_workspace_and_prefix_and_are_graded_on_their_own(service, llm) -> None:
    accepted = service.client.submit(
        "swe", [as_instance(INTERVALS, SWE)], limits={"max_turns": 8, "tool_timeout": 10}, llm=llm
    )
    service.wait_done(accepted.job_id, timeout=240)
    parent = service.client.rollout(accepted.rollout_ids[0])
    assert (parent.outcome, parent.reward) == ("completed", 0.0), (parent.error, service.log_tail())
    assert len(parent.turns) == 6 and parent.turns[K].tool_calls[0]["arguments"]["command"] == HASH
    parent_hash = parent.turns[K].observation
    assert len(parent_hash.split()[0]) == 64, parent_hash  # a sha256 was printed
    before = _stats(llm)

    created = time.time()
    branches = service.client.branch(parent.rollout_id, turn=K, n=M, idempotency_key="tree-1")
    assert branches.created and len(branches.rollout_ids) == M and branches.branch_turn == K
    again = service.client.branch(parent.rollout_id, turn=K, n=M, idempotency_key="tree-1")
    assert (again.job_id, again.rollout_ids, again.created) == (branches.job_id, branches.rollout_ids, False)
    with pytest.raises(RaasHTTPError) as reused:  # the same key for another request
        service.client.branch(parent.rollout_id, turn=K - 1, n=M, idempotency_key="tree-1")
    assert reused.value.status == 409 and "turn" in str(reused.value)
    service.wait_done(branches.job_id, timeout=300)
    assert branches.job_id != parent.job_id
    assert service.client.job(parent.job_id).n_rollouts == 1  # the parent's job is as it was

    views = [service.client.rollout(rid) for rid in branches.rollout_ids]
    for view in views:
        assert (view.parent_rollout_id, view.branch_turn) == (parent.rollout_id, K)
        assert view.outcome == "completed", (view.error, service.log_tail())
        # the workspace it resumed in is the parent's at turn K (content hash, .git aside)
        assert view.turns[K + 1].tool_calls[0]["arguments"]["command"] == HASH
        assert view.turns[K + 1].observation == parent_hash
        # its record begins with the parent's turns 0..K, token for token
        assert view.prompt_ids == parent.prompt_ids
        cut = _prefix_length(parent)
        assert cut == _prefix_length(view) and cut > 0
        for name in ("response_ids", "response_logprobs", "loss_mask"):
            assert getattr(view, name)[:cut] == getattr(parent, name)[:cut], name
        for mine, theirs in zip(view.turns[: K + 1], parent.turns[: K + 1]):
            assert (mine.generated_ids, mine.logprobs) == (theirs.generated_ids, theirs.logprobs)
            assert mine.extra["replayed_from_attempt"] == 0  # inherited, replayed, not generated
        assert view.metrics["replayed_turns"] == K + 1 and view.metrics["replay_divergences"] == []
        assert len(view.turns) == 6 and view.attempt == 1
    # each graded on its own artifact: two fixed the bug, two did nothing
    assert sorted(v.reward for v in views) == [0.0, 0.0, 1.0, 1.0]
    for v in views:
        fixed = "max(merged[-1][1], end)" in v.extra.get("git_patch", "")
        assert fixed == (v.reward == 1.0)

    after = _stats(llm)
    asked = {t: after.get(f"turn:{KEY}:{t}", 0) - before.get(f"turn:{KEY}:{t}", 0) for t in range(6)}
    assert asked == {0: 0, 1: 0, 2: 0, 3: M, 4: M, 5: M}  # the prefix was never generated again

    with session_scope(service.settings.db_url) as s:
        inherited = s.execute(
            select(Turn.rollout_id, Turn.index).where(Turn.rollout_id.in_(branches.rollout_ids), Turn.attempt == 0)
        ).all()
        labels = s.get(Job, branches.job_id).config["labels"]
        layers = s.execute(select(GroupLayer.mode).where(GroupLayer.job_id == branches.job_id)).all()
    assert len(inherited) == M * (K + 1)
    assert layers == [("overlay",)]  # the branches forked one INIT, copy-on-write
    assert labels == {"branch_of": parent.rollout_id, "branch_turn": str(K)}

    tree = service.client.tree(parent.rollout_id, timeout=10)
    assert [b.rollout_id for b in tree.branches] == branches.rollout_ids
    advantages = tree.advantages()
    for v in views:  # rloo: its reward minus the mean of its three siblings'
        expected = 1.0 - 1.0 / 3 if v.reward == 1.0 else 0.0 - 2.0 / 3
        assert advantages[v.rollout_id] == pytest.approx(expected)

    figures = {
        "first_live_reply_after_creation_s": [round(v.metrics["first_live_reply_at"] - created, 3) for v in views],
        "replay_seconds": [v.metrics["replay_seconds"] for v in views],
        "init_seconds": [v.timing.init for v in views],
    }
    print("BRANCH FIGURES", json.dumps(figures))
    assert all(0 < x < 120 for x in figures["first_live_reply_after_creation_s"])
