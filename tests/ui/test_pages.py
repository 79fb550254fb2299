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
