"""The SDK's path into a training step, against the real service: gateway over HTTP, Celery
worker processes, a real tokenizer and agent loop, the LLM simulator (a fake model) with a
`wrong_rate` so rewards vary. Typed rows, `collect` (K groups or T seconds, staleness),
`failure_class` (infra excluded and reported, policy kept at reward 0), `to_arrays`,
advantages."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from fakellm.server import start_simulator
from raas_client import Batch, Collector, Group, RolloutView
from raas_client.cli import results, status
from bench.support.pipeline_harness import start_service

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`
SMOLLM2 = str(REPO / "tests" / "fixtures" / "smollm2-tokenizer")
OBSERVE = '<tool_call>{"name": "observe", "arguments": {}}</tool_call>'
SCRIPT = {"default": [OBSERVE, "So it is \\boxed{4}."], "wrong": "So it is \\boxed{5}.", "wrong_rate": 0.4, "seed": 7}
N = 4


def instance(name: str, **data) -> dict:
    return {"instance_id": name, "data": {"answer": "4", **data}}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    svc = start_service(
        tmp_path_factory.mktemp("sdk-batches"),
        concurrency=3,
        handler_modules="tests.sdk.handlers",
        extra={"max_attempts": 1},
    )
    url, stop = start_simulator(SMOLLM2, SCRIPT)
    server = svc.client.add_llm_server(url, weight_version="step-1")
    svc.server_id = server.id
    yield svc
    stop()
    svc.stop()


@pytest.fixture(scope="module")
def job(service):
    """One job of four groups on the pool: g0 has an infra failure, g1 a policy failure."""
    accepted = service.client.submit(
        "test-grpo",
        [instance("g0", infra_samples=[1]), instance("g1", policy_samples=[2]), instance("g2"), instance("g3")],
        n_samples=N,
    )
    return accepted.job_id


def test_collect_gives_k_groups_then_the_rest(service, job):
    first = service.client.collect(job, groups=2, timeout=120)
    assert isinstance(first, Batch) and len(first.groups) == 2 and not first.timed_out
    rest = service.client.collect(job, groups=10, timeout=120)  # goes on from the cursor
    assert len(rest.groups) == 2 and rest.job_done and not rest.timed_out, service.log_tail()
    groups = {g.instance_id: g for g in first.groups + rest.groups}
    assert sorted(groups) == ["g0", "g1", "g2", "g3"]
    for g in groups.values():
        assert isinstance(g, Group) and all(isinstance(r, RolloutView) for r in g.rollouts)
        assert [r.sample_index for r in g.rollouts] == list(range(N))

    g0, g1 = groups["g0"], groups["g1"]
    infra = g0.rollouts[1]
    assert (infra.outcome, infra.failure_class, infra.reward) == ("infra_error", "infra", None)
    assert g0.short and g0.n_infra == 1 and len(g0.samples) == N - 1
    assert infra.rollout_id not in {r.rollout_id for r in g0.samples}
    policy = g1.rollouts[2]
    assert (policy.outcome, policy.failure_class, policy.train_reward) == ("agent_error", "policy", 0.0)
    assert not g1.short and policy in g1.samples and len(g1.rewards) == N

    samples = [r for g in groups.values() for r in g.samples]
    assert all(r.response_ids and set(r.policy_versions) == {"step-1"} for r in samples)
    rewards = [
        r.reward for g in groups.values() for r in g.rollouts if g.instance_id != "g1" and r.failure_class == "none"
    ]
    assert set(rewards) == {0.0, 1.0}, rewards  # the simulator's wrong answers: variance
    # with include_infra the infra failure counts as a reward-0 sample
    whole = Group(**{**g0.model_dump(), "include_infra": True})
    assert not whole.short and whole.rewards[1] == 0.0


def test_advantages_and_arrays_from_a_real_batch(service):
    accepted = service.client.submit("test-grpo", [instance("a0"), instance("a1")], n_samples=N)
    batch = service.client.collect(accepted.job_id, groups=2, timeout=120)
    assert len(batch.groups) == 2, service.log_tail()
    for g in batch.groups:
        adv = g.advantages("grpo")
        mean = sum(g.rewards) / N
        std = math.sqrt(sum((r - mean) ** 2 for r in g.rewards) / (N - 1))
        assert adv == pytest.approx([(r - mean) / (std + 1e-6) for r in g.rewards])
        assert sum(adv) == pytest.approx(0.0, abs=1e-6)
        rloo = g.advantages("rloo")
        assert rloo == pytest.approx([r - (sum(g.rewards) - r) / (N - 1) for r in g.rewards])

    arrays = batch.to_arrays(pad_id=-7, backend="numpy")
    samples = batch.samples
    lengths = [len(r.prompt_ids) + len(r.response_ids) for r in samples]
    assert arrays["input_ids"].shape == (len(samples), max(lengths))
    assert arrays["attention_mask"].sum(axis=1).tolist() == lengths
    assert np.allclose(arrays["advantages"], batch.advantages("grpo"))
    assert arrays["rewards"].tolist() == batch.rewards
    for b, r in enumerate(samples):
        p, n = len(r.prompt_ids), len(r.response_ids)
        assert arrays["input_ids"][b, : p + n].tolist() == r.prompt_ids + r.response_ids
        assert (arrays["input_ids"][b, p + n :] == -7).all()
        assert arrays["loss_mask"][b, p : p + n].tolist() == r.loss_mask
        assert arrays["loss_mask"][b].sum() == sum(r.loss_mask) > 0
        generated = np.array(r.loss_mask, dtype=bool)
        assert np.allclose(arrays["old_logprobs"][b, p : p + n][generated], np.array(r.response_logprobs)[generated])
        assert (arrays["old_logprobs"][b, p : p + n][~generated] == 0).all()
        # every generated token carries the version of its turn (step-1), nothing else does
        versions = arrays["policy_version"][b]
        assert ((versions == 1) == (arrays["loss_mask"][b] == 1)).all()
        assert set(versions[~(arrays["loss_mask"][b] == 1)].tolist()) == {-1}


def test_stale_samples_are_dropped_and_reported(service, job):
    service.wait_done(job, timeout=180)  # every sample generated at step-1 before the bump
    service.client.update_llm_server(service.server_id, weight_version="step-3")
    try:
        stale = Collector(service.client, job).collect(groups=4, timeout=60, max_staleness=1)
        assert stale.current_version == 3  # the pool's newest version
        assert len(stale.groups) == 4 and all(g.short for g in stale.groups)
        used = sum(len(g.rollouts) - g.n_infra for g in stale.groups)
        assert len(stale.stale) == used and stale.samples == []
        fresh = Collector(service.client, job).collect(groups=4, timeout=60, max_staleness=2)
        assert fresh.stale == [] and len(fresh.samples) == 4 * N - 1
    finally:
        service.client.update_llm_server(service.server_id, weight_version="step-1")


def test_collect_returns_at_the_timeout_with_what_completed(service):
    url, stop = start_simulator(SMOLLM2, {"default": [OBSERVE, "\\boxed{4}"], "latency": 30})
    try:
        accepted = service.client.submit(
            "test-grpo", [instance("slow")], n_samples=2, llm={"servers": [{"url": url}], "tokenizer": SMOLLM2}
        )
        batch = service.client.collect(accepted.job_id, groups=1, timeout=2)
        assert batch.groups == [] and batch.timed_out and not batch.job_done
        assert 1.5 < batch.seconds < 10
        service.client.cancel(accepted.job_id)
    finally:
        stop()


def test_rows_parse_from_the_wire_json(service, job):
    """The gateway serves the SDK's model: a raw row parses, and carries failure_class."""
    page = service.client.results_page(job, 0, wait=0, limit=100)
    assert page.items and all(i.failure_class in ("none", "policy", "infra") for i in page.items)
    row = RolloutView.model_validate(json.loads(page.items[0].model_dump_json()))
    assert row.model_dump(mode="json")["failure_class"] == page.items[0].failure_class


def test_out_rows_are_the_api_records(service, job, tmp_path):
    """`raas results JOB --out F` writes the record the API returns: metrics, group markers,
    failure_class; each line parses as the SDK's RolloutView."""
    out = tmp_path / "rows.jsonl"
    res = CliRunner().invoke(results, [job, "--out", str(out), "--url", service.url])
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    api = service.all_results(job)
    assert lines == [r.model_dump(mode="json") for r in api] and len(lines) == 4 * N
    assert sum(r["group_complete"] for r in lines) == 4
    assert all(r["metrics"].get("turns") for r in lines if r["failure_class"] == "none")
    assert [RolloutView.model_validate(r).failure_class for r in lines] == [r["failure_class"] for r in lines]


def test_short_job_ids_work_in_the_cli(service, job):
    short = job[:12]  # as the dashboard shows it
    res = CliRunner().invoke(status, [short, "--url", service.url])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["job_id"] == job
    res = CliRunner().invoke(results, [short, "--url", service.url])
    assert res.exit_code == 0 and len(res.output.strip().splitlines()) >= 4 * N
    # an ambiguous prefix: at most 17 jobs give two ids with the same first character
    ids = [j.job_id for j in service.client.jobs(limit=100).jobs]
    while len({i[0] for i in ids}) == len(ids):
        ids.append(service.client.submit("test-sleepy", [{"instance_id": "x"}]).job_id)
    first = next(i[0] for i in ids if sum(j[0] == i[0] for j in ids) > 1)
    res = CliRunner().invoke(status, [first, "--url", service.url])
    assert res.exit_code == 1 and "is ambiguous" in res.output and "type more" in res.output
    res = CliRunner().invoke(status, ["zzzz", "--url", service.url])
    assert res.exit_code == 1 and "job 'zzzz' not found" in res.output
