"""A split harness rollout's samples, from the endpoint's record through the database to
the results wire, the SDK's `Batch` rows and the ProRL result (real SQLite schema built by the
migrations; the endpoint on the simulator with the openai SDK, as in the endpoint tests)."""

from __future__ import annotations

import json

from agents.abstract import Trajectory
from app.api.prorl_results import prorl_result
from app.jobs import rollout_view
from core.db import session_scope
from core.models import Job, Rollout, Turn
from migrations.runner import upgrade
from raas_client import Batch, Group
from raas_client import RolloutView
from tests.harness.conftest import BASH_TOOL, openai_client, recorded

SCRIPT = {"default": ["Looking.", "Still looking.", "Found it."]}
START = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Task i-1: fix it."}]


def split_rollout(endpoint) -> tuple[Trajectory, list[dict]]:
    """Two calls, then the harness drops its history: 2 samples (2 calls + 1 call)."""
    ep = endpoint(SCRIPT)
    client = openai_client(ep)
    messages = list(START)
    for _ in range(2):
        reply = client.chat.completions.create(model="p", messages=messages, tools=[BASH_TOOL])
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "go on"}]
    client.chat.completions.create(
        model="p",
        tools=[BASH_TOOL],
        messages=[START[0], {"role": "user", "content": "Task i-1: fix it. Notes: looked twice."}],
    )
    return ep.result("completed", "harness_exit"), recorded(ep)


def stored(url: str, result: Trajectory, turns: list[dict], reward: float) -> tuple[str, str]:
    """The rollout as the pipeline stores it (RUN's fields, EVAL's reward, the turn log)."""
    upgrade(url)
    with session_scope(url) as s:
        job = Job(agent="harness", config={}, n_instances=1, n_samples=1)
        s.add(job)
        s.flush()
        row = Rollout(
            job_id=job.id,
            instance_id="i-1",
            sample_index=0,
            status="done",
            outcome=result.outcome,
            finish_reason=result.finish_reason,
            prompt_ids=result.prompt_ids,
            response_ids=result.response_ids,
            response_logprobs=result.response_logprobs,
            loss_mask=result.loss_mask,
            policy_versions=result.policy_versions,
            token_exact=result.token_exact,
            messages=result.messages,
            metrics=result.metrics,
            extra=result.extra,
            reward=reward,
        )
        s.add(row)
        s.flush()
        for turn in turns:
            s.add(Turn(rollout_id=row.id, attempt=row.attempt, **turn))
        return url, row.id


def test_split_samples_reach_the_wire_the_batch_and_prorl(endpoint, tmp_path) -> None:
    result, turns = split_rollout(endpoint)
    assert len(result.extra["samples"]) == 2
    url, rollout_id = stored(f"sqlite:///{tmp_path / 'raas.db'}", result, turns, reward=1.0)
    with session_scope(url) as s:
        row = s.get(Rollout, rollout_id)
        view = rollout_view(row)
        stored_turns = s.query(Turn).filter_by(rollout_id=rollout_id).order_by(Turn.index).all()
        prorl = prorl_result(row, stored_turns, {"trajectory_id": 0}, "i-1")

    wire = RolloutView.model_validate(json.loads(view.model_dump_json()))
    assert "samples" not in wire.extra and len(wire.samples) == 2
    assert wire.samples[1].split_reason == "history_rewritten" and wire.samples[0].calls == 2
    assert wire.response_ids == wire.samples[1].response_ids  # main arrays: the last sample

    rows = wire.training_rows()
    assert [r.response_ids for r in rows] == [s.response_ids for s in wire.samples]
    assert rows[0].turn_boundaries == wire.samples[0].turn_boundaries
    other = wire.model_copy(update={"rollout_id": "r2", "sample_index": 1, "reward": 0.0, "samples": None})
    batch = Batch(groups=[Group(job_id=wire.job_id, instance_id="i-1", rollouts=[wire, other])])
    arrays = batch.to_arrays(backend="numpy")
    assert arrays["input_ids"].shape[0] == 3  # 2 samples of the split rollout + 1
    assert list(arrays["rewards"]) == [1.0, 1.0, 0.0]
    adv = batch.advantages()
    assert list(arrays["advantages"]) == [adv[0], adv[0], adv[1]]
    first = wire.samples[0]
    n = len(first.prompt_ids) + len(first.response_ids)
    assert list(arrays["input_ids"][0][:n]) == first.prompt_ids + first.response_ids
    assert list(arrays["loss_mask"][0][len(first.prompt_ids) : n]) == first.loss_mask
    assert (arrays["policy_version"][0][len(first.prompt_ids) : n] == 7).sum() == sum(
        first.loss_mask
    )  # weight version "v7" on every generated token

    assert [s["response_ids"] for s in prorl["samples"]] == [s.response_ids for s in wire.samples]
    assert prorl["prompt_ids"] == wire.samples[1].prompt_ids
    assistant = [m for m in prorl["messages"] if m["role"] == "assistant"]
    assert [m["logprobs"] for m in assistant] == [turns[2]["logprobs"]]
    assert prorl["reward"] == 1.0
    assert [t["function"]["name"] for t in prorl["tools"]] == ["bash"]


def test_the_dashboard_shows_each_sample(endpoint, tmp_path) -> None:
    from app import create_app

    result, turns = split_rollout(endpoint)
    app = create_app({"home": tmp_path, "node": "n1"})
    _, rollout_id = stored(app.config["RAAS"].db_url, result, turns, reward=1.0)
    client = app.test_client()
    page = client.get(f"/ui/rollouts/{rollout_id}")
    assert page.status_code == 200 and 'id="samples"' in page.text
    assert "sample 1 · history_rewritten · 1 calls" in page.text
    assert page.text.count('class="turn"') == 1  # the last sample's one call
    first = client.get(f"/ui/rollouts/{rollout_id}?sample=0")
    assert first.text.count('class="turn"') == 2
    samples = result.extra["samples"]
    for k in (0, 1):
        segs = client.get(f"/ui/rollouts/{rollout_id}/tokens.json?segment=all&sample={k}").json
        ids = [i for seg in segs["segments"] for i in seg["ids"]]
        assert ids == samples[k]["prompt_ids"] + samples[k]["response_ids"]
        mask = [m for seg in segs["segments"][1:] for m in seg["mask"]]
        assert mask == samples[k]["loss_mask"]
