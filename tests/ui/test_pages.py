"""Pages render for rollouts in every state, without a browser (Flask's test client, SQLite)."""

from __future__ import annotations

import pytest

from app import create_app
from core.db import session_scope
from core.models import Job, Rollout, Turn
from migrations.runner import upgrade


@pytest.fixture
def app(tmp_path):
    app = create_app({"home": tmp_path, "node": "n1"})
    upgrade(app.config["RAAS"].db_url)
    return app


def add(app, **rollout) -> tuple[str, str]:
    with session_scope(app.config["RAAS"].db_url) as s:
        job = Job(agent="test-trivial", n_instances=1, n_samples=1, config={})
        s.add(job)
        s.flush()
        r = Rollout(job_id=job.id, instance_id="i<script>", **rollout)
        s.add(r)
        s.flush()
        return job.id, r.id


@pytest.mark.parametrize(
    "state",
    [
        {"status": "pending"},
        {"status": "failed", "outcome": "infra_error", "error": "node lost <b>x</b>", "attempt": 3},
        {
            "status": "done",
            "outcome": "completed",
            "reward": 1.0,
            "prompt_ids": [1, 2],
            "response_ids": [5, 6, 7],
            "loss_mask": [1, 1, 0],
            "response_logprobs": [-1.0, -2.0, 0.0],
            "init_seconds": 0.1,
            "run_seconds": 1.0,
            "eval_seconds": 0.2,
            "extra": {
                "git_patch": "--- a/x\n+++ b/x\n-old\n+new",
                "files": {"sol.py": "print(1)"},
                "dropped_files": ["tests/test_x.py"],
            },
        },
    ],
)
def test_job_and_rollout_pages_render_in_every_state(app, state) -> None:
    job_id, rollout_id = add(app, **state)
    client = app.test_client()
    job = client.get(f"/ui/jobs/{job_id}")
    assert job.status_code == 200 and "i&lt;script&gt;" in job.text  # escaped, not markup
    page = client.get(f"/ui/rollouts/{rollout_id}")
    assert page.status_code == 200 and "<script>" not in page.text.replace(
        '<script src="/ui/static/ui.js"></script>', ""
    )
    if state.get("error"):
        assert "node lost &lt;b&gt;x&lt;/b&gt;" in page.text
    if state.get("extra"):
        assert 'class="add">+new' in page.text and "sol.py" in page.text
        assert "tests/test_x.py" in page.text
        tokens = client.get(f"/ui/rollouts/{rollout_id}/tokens.json?segment=all").json
        assert [len(s["ids"]) for s in tokens["segments"]] == [2, 3]
        assert tokens["segments"][1]["pieces"] is None  # no tokenizer recorded
    bad = client.get(f"/ui/rollouts/{rollout_id}/tokens.json?segment=9")
    assert bad.status_code == 400 and "segment" in bad.json["message"]


def test_a_running_rollout_shows_its_logged_turns(app) -> None:
    _, rollout_id = add(app, status="run", node="n1")
    with session_scope(app.config["RAAS"].db_url) as s:
        s.add(
            Turn(
                rollout_id=rollout_id,
                index=0,
                text="thinking",
                generated_ids=[1, 2],
                logprobs=[-0.5, -0.25],
                observation_ids=[7, 8, 9],
                weight_version="v3",
                tool_calls=[{"name": "bash", "arguments": {"command": "ls"}}],
                observation="README.md",
                gen_seconds=0.5,
                tool_seconds=0.1,
            )
        )
    client = app.test_client()
    page = client.get(f"/ui/rollouts/{rollout_id}")
    assert page.status_code == 200
    assert 'id="turn-0"' in page.text and "README.md" in page.text and "bash" in page.text
    assert 'id="live-note"' in page.text
    turn = client.get(f"/ui/rollouts/{rollout_id}/tokens.json?segment=1").json
    assert turn["live"] and turn["ids"] == [1, 2, 7, 8, 9] and turn["mask"] == [1, 1, 0, 0, 0]
    assert turn["logprobs"] == [-0.5, -0.25, 0.0, 0.0, 0.0]
    assert turn["versions"] == ["v3", "v3", None, None, None]


def test_stage_view_and_jobs_page_render_with_nothing(app) -> None:
    client = app.test_client()
    assert client.get("/ui/").status_code == 200
    page = client.get("/ui/stages")
    assert page.status_code == 200 and 'data-queue="init"' in page.text
    assert client.get("/ui/jobs/nope").status_code == 404


def test_recovery_counts_tokens_generated_again_not_replayed(app) -> None:
    """Attempt 1 logged turns 0-2 and was lost; attempt 2 started over and was lost after turn 0;
    attempt 3 replayed attempt 2's turn 0 (itself generated) and generated turns 1-2 live. The
    job and rollout pages say: attempt 1's three turns (6 tokens) were generated for nothing,
    attempt 2's turn 0 was carried into attempt 3 (one turn replayed)."""
    from app.recovery_costs import rollout_cost

    job_id, rollout_id = add(app, status="run", node="n1", attempt=3)
    logged = [
        (1, 0, [1, 2], {}),
        (1, 1, [3, 4, 5], {}),
        (1, 2, [6], {}),
        (2, 0, [7, 8], {}),
        (3, 0, [7, 8], {"replayed_from_attempt": 2}),
        (3, 1, [9], {}),
        (3, 2, [10, 11], {}),
    ]
    with session_scope(app.config["RAAS"].db_url) as s:
        for attempt, index, ids, extra in logged:
            s.add(Turn(rollout_id=rollout_id, attempt=attempt, index=index, generated_ids=ids, extra=extra))
    with session_scope(app.config["RAAS"].db_url) as s:
        cost = rollout_cost(3, s.query(Turn).filter_by(rollout_id=rollout_id).all())
    assert (cost.rollouts_retried, cost.replayed_turns, cost.regenerated_turns, cost.regenerated_tokens) == (1, 1, 3, 6)
    client = app.test_client()
    page = client.get(f"/ui/rollouts/{rollout_id}")
    assert "4 turns logged by earlier attempts: 1 replayed, 3 generated again, 6 tokens" in page.text
    job = client.get(f"/ui/jobs/{job_id}")
    assert 'data-regenerated-tokens="6"' in job.text


def test_a_replay_chain_is_followed_to_the_turn_that_was_generated() -> None:
    """Attempt 3 replays attempt 2's turn, which attempt 2 had replayed from attempt 1: the
    generated turn is attempt 1's, and nothing was generated twice."""
    from types import SimpleNamespace as T

    from app.recovery_costs import rollout_cost

    turns = [
        T(attempt=1, index=0, generated_ids=[1, 2], extra={}),
        T(attempt=2, index=0, generated_ids=[1, 2], extra={"replayed_from_attempt": 1}),
        T(attempt=3, index=0, generated_ids=[1, 2], extra={"replayed_from_attempt": 2}),
    ]
    cost = rollout_cost(3, turns)
    assert (cost.replayed_turns, cost.regenerated_turns, cost.regenerated_tokens) == (1, 0, 0)
    assert rollout_cost(1, turns[:1]).regenerated_turns == 0


def test_a_harness_job_page_sums_what_its_model_api_saw(app) -> None:
    """Two finished harness rollouts' endpoint counters (one split twice, one with a streamed
    call and a refusal) summed on the job page; a rollout still running counts for nothing."""
    from app.harness_figures import harness_figures

    metrics = [
        {
            "calls": 5,
            "samples": 3,
            "merges": 2,
            "splits": 2,
            "split_reasons": {"history_rewritten": 2},
            "malformed_tool_calls": 1,
            "tool_choice_unmet": 1,
            "streamed_calls": 0,
            "failed_calls": 0,
        },
        {
            "calls": 3,
            "samples": 1,
            "merges": 2,
            "splits": 0,
            "failed_calls": 1,
            "errors": {"context": 1},
            "refusals": {"n": 1},
            "streamed_calls": 2,
            "ttft_ms_p50": 12.5,
            "ttft_ms_max": 30.0,
        },
        {"turns": 3},  # a loop agent's metrics: not a harness rollout
    ]
    figures = harness_figures(metrics)
    assert figures.rollouts == 2 and figures.counts["calls"] == 8 and figures.counts["samples"] == 4
    assert (figures.parse_failures, figures.split_reasons, figures.ttft_ms_p50) == (1, {"history_rewritten": 2}, 12.5)
    with session_scope(app.config["RAAS"].db_url) as s:
        job = Job(agent="harness", n_instances=3, n_samples=1, config={})
        s.add(job)
        s.flush()
        for k, m in enumerate(metrics[:2]):
            s.add(
                Rollout(job_id=job.id, instance_id=f"i{k}", status="done", outcome="completed", reward=1.0, metrics=m)
            )
        s.add(Rollout(job_id=job.id, instance_id="running", status="run", metrics={"calls": 99}))
        job_id = job.id
    page = app.test_client().get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200
    assert 'id="harness" data-calls="8" data-splits="2"' in page.text
    assert "history_rewritten 2" in page.text and "context 1" in page.text and "12.5 / 30.0" in page.text


def test_turns_restored_from_a_checkpoint_are_carried_not_generated_again() -> None:
    """Issue 41: a turn restored from a workspace checkpoint keeps `replayed_from_attempt` (it
    was not generated again) and is counted as restored, not replayed."""
    from types import SimpleNamespace as T

    from app.recovery_costs import rollout_cost

    turns = [
        T(attempt=1, index=0, generated_ids=[1, 2], extra={}),
        T(attempt=1, index=1, generated_ids=[3], extra={}),
        T(attempt=2, index=0, generated_ids=[1, 2], extra={"replayed_from_attempt": 1, "restored_from_checkpoint": 0}),
        T(attempt=2, index=1, generated_ids=[3], extra={"replayed_from_attempt": 1}),
        T(attempt=2, index=2, generated_ids=[4], extra={}),
    ]
    cost = rollout_cost(2, turns)
    assert (cost.restored_turns, cost.replayed_turns, cost.regenerated_turns) == (1, 1, 0)
