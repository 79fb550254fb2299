"""The job page's numbers and the token view's segments, without a browser."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from app.ui import charts, tokens
from core.models import Rollout, Turn

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def row(
    instance: str,
    k: int,
    reward: float | None,
    outcome: str = "completed",
    run: float = 1.0,
    done_after: float | None = 10.0,
) -> dict:
    return {
        "id": f"{instance}-{k}",
        "instance_id": instance,
        "sample_index": k,
        "reward": reward,
        "outcome": outcome,
        "status": "done",
        "error": None,
        "init_seconds": 0.5,
        "run_seconds": run,
        "eval_seconds": 0.1,
        "created_at": T0,
        "finished_at": None if done_after is None else T0 + timedelta(seconds=done_after),
    }


def test_groups_have_grpo_mean_and_population_std() -> None:
    rows = [row("b", 1, 0.0), row("b", 0, 1.0), row("a", 0, 1.0), row("b", 2, None, "infra_error")]
    groups = charts.groups(rows)
    assert [g.instance_id for g in groups] == ["a", "b"]
    b = groups[1]
    assert [s["sample_index"] for s in b.samples] == [0, 1, 2]
    assert b.mean == 0.5 and b.std == 0.5  # the infra failure has no reward: not counted
    assert groups[0].std == 0.0


def test_histograms_throughput_slowest_failed() -> None:
    rows = [row("a", k, 1.0, run=float(k), done_after=k * 2.0) for k in range(1, 7)]
    rows.append(row("z", 0, None, "timeout", run=50.0, done_after=None))
    hist = charts.histogram([r["run_seconds"] for r in rows], n_bins=5)
    assert sum(hist["counts"]) == 7 and hist["counts"][-1] == 1 and hist["edges"][-1] == 50.0
    tp = charts.throughput(rows, T0, n_bins=6)
    assert tp["n"] == 6 and tp["span"] == 12.0 and sum(tp["counts"]) == 6
    assert [r["sample_index"] for r in charts.slowest(rows, 2)] == [6, 5]  # unfinished: out
    assert [r["id"] for r in charts.failed(rows)] == ["z-0"]


def _rollout(boundaries=None) -> Rollout:
    return Rollout(
        prompt_ids=[1, 2, 3],
        response_ids=[10, 11, 12, 13, 14, 15],
        loss_mask=[1, 1, 0, 1, 0, 0],
        response_logprobs=[-0.1, -0.2, 0, -0.3, 0, 0],
        policy_versions=["v1", "v2"],
        extra={"turn_boundaries": boundaries} if boundaries else {},
    )


@pytest.mark.parametrize("boundaries", [[[0, 2], [3, 4]], None])
def test_segments_follow_turn_boundaries_or_the_turn_log(boundaries) -> None:
    turns = [
        Turn(index=0, generated_ids=[10, 11], observation_ids=[12]),
        Turn(index=1, generated_ids=[13], observation_ids=[14, 15]),
    ]
    segs = tokens.segments(_rollout(boundaries), turns)
    assert [(s["start"], s["end"], s["turn"]) for s in segs] == [(0, 3, None), (3, 6, 0), (6, 9, 1)]


def test_token_rows_carry_mask_logprob_and_the_turns_policy_version() -> None:
    r = _rollout([[0, 2], [3, 4]])
    rows = tokens.token_rows(r, type("J", (), {"config": {}})(), 2, 8)
    assert rows["ids"] == [3, 10, 11, 12, 13, 14]
    assert rows["mask"] == [0, 1, 1, 0, 1, 0]
    assert rows["logprobs"] == [None, -0.1, -0.2, 0, -0.3, 0]
    assert rows["versions"] == [None, "v1", "v1", None, "v2", None]
    assert rows["pieces"] is None  # no tokenizer recorded: the page shows ids
