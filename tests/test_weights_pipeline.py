"""Pool-wide pause and verified weight pushes through the real pipeline: gateway over HTTP,
Celery worker processes, Redis + PostgreSQL, the LLM simulator (a fake vLLM, named as such)
registered as the caller's pool, and the `test-chat` agent (one `observe` call per turn).

The simulator's logprobs follow the weights a push loaded (`fakellm.weights`), so the
tests can check that a turn recorded with a version was really sampled with those weights.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from raas_client import RaasHTTPError
from raas_client.weights import DEFAULT_PROBE_TEXT, TiedCheckpoint
from raas_client.weights_cli import weights
from tokenizers import Tokenizer

from fakellm.weights import WeightState, fingerprint, weights_logprob, write_checkpoint
from fakellm.script import fake_logprob
from fakellm.server import start_simulator
from core.db import session_scope
from core.models import LLMServer
from tests.conftest import REDIS_URL
from bench.support.pipeline_harness import start_service, wait_for
from raas_client.models import RolloutView

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`

REPO = Path(__file__).resolve().parent
SMOLLM2 = str(REPO / "fixtures" / "smollm2-tokenizer")
CALL = '<tool_call>{"name": "observe", "arguments": {}}</tool_call>'
LLM = {"tokenizer": SMOLLM2, "max_model_len": 4096}  # no servers: the caller's pool


def script(latency: float, **weights) -> dict:
    return {"default": [{"text": CALL, "latency": latency}], "weights": weights}


@pytest.fixture
def service(tmp_path, pg_url, redis_prefix):
    svc = start_service(
        tmp_path,
        db_url=pg_url,
        broker_url=REDIS_URL,
        key_prefix=redis_prefix,
        concurrency={"init": 2, "run": 4, "eval": 2},
    )
    yield svc
    svc.stop()


@pytest.fixture
def sims():
    stops = []

    def start(latency: float, **weights) -> str:
        url, stop = start_simulator(SMOLLM2, script(latency, **weights))
        stops.append(stop)
        return url

    yield start
    for stop in stops:
        stop()


def probe(seed: str) -> dict:
    """The trainer's fingerprint of weights `seed`: the simulator answers the probe prompt
    with its scripted reply, whose ids are the greedy tokens."""
    tok = Tokenizer.from_file(f"{SMOLLM2}/tokenizer.json")
    reply = tok.encode(CALL, add_special_tokens=False).ids + [tok.token_to_id("<|im_end|>")]
    return fingerprint(seed, tok.encode(DEFAULT_PROBE_TEXT).ids, reply)


def in_flight(url: str) -> int:
    stats = httpx.get(f"{url}/sim/stats").json()
    return stats.get("started", 0) - stats.get("requests", 0) - stats.get("aborted", 0)


def rows(db_url: str) -> list[LLMServer]:
    with session_scope(db_url) as s:
        return list(s.query(LLMServer).order_by(LLMServer.created_at))


def turn_logprobs_match(detail: RolloutView, state_of: dict) -> bool:
    """Every turn's logprobs are what the weights of its recorded version give (position =
    its offset in the full sequence; v0 = the never-pushed simulator)."""
    spans, start = [], None
    mask = detail.loss_mask + [0]
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append(start)
            start = None
    base = len(detail.prompt_ids)
    for turn, offset in zip(detail.turns, spans):
        state = state_of[turn.weight_version]
        expected = [
            fake_logprob(t, base + offset + i) if state is None else weights_logprob(state, t, base + offset + i)
            for i, t in enumerate(turn.generated_ids)
        ]
        if turn.logprobs != pytest.approx(expected, abs=1e-9):
            return False
    return True


def test_push_mid_job_waits_for_turns_verifies_and_records_versions(service, sims, tmp_path) -> None:
    url = sims(0.8)
    client = service.client
    client.add_llm_server(url, model=SMOLLM2, weight_version="v0")
    job = client.submit(
        "test-chat",
        [{"instance_id": f"i{k}", "data": {}} for k in range(4)],
        n_samples=2,
        llm=LLM,
        agent_config={"turns": 4, "observation_words": 5},
    )
    wait_for(lambda: in_flight(url) >= 2, 180, "turns in flight")
    report = client.push_weights(str(write_checkpoint(tmp_path / "v1", "v1")), "v1", probe("v1"), timeout=60)
    [server] = report.servers
    assert report.resumed and server.ok and server.check.max_abs_diff == 0.0
    assert server.generating_at_pause >= 1  # it waited for in-flight turns ...
    assert server.pause_seconds > 0.05 and report.pause_seconds < 5
    assert server.before_max_abs_diff > 1e-3  # the old weights did not pass
    assert rows(service.settings.db_url)[0].weight_version == "v1"
    done = service.wait_done(job.job_id, timeout=120)
    assert done.outcomes == {"completed": 8}  # ... and aborted nothing
    results = service.all_results(job.job_id)
    assert [r.reward for r in results] == [1.0] * 8
    versions = [client.rollout(r.rollout_id) for r in results]
    seen = {v for d in versions for v in d.policy_versions}
    assert seen == {"v0", "v1"}
    for detail in versions:
        by_turn = [t.weight_version for t in detail.turns]
        assert by_turn == sorted(by_turn)  # v0 turns, then v1 turns, never back
        assert turn_logprobs_match(detail, {"v0": None, "v1": WeightState("v1", "v1")})
    assert httpx.get(f"{url}/sim/stats").json().get("aborted", 0) == 0


def test_failed_pushes_refuse_or_keep_the_pool_paused(service, sims, tmp_path) -> None:
    good, no_reset = sims(0.2), sims(0.2, reset_noop=True)
    client = service.client
    client.add_llm_server(good, model=SMOLLM2, weight_version="v0")
    ids = [s.id for s in client.llm_servers()]
    tied = write_checkpoint(tmp_path / "tied", "v1", tied=True)
    with pytest.raises(TiedCheckpoint, match="tie_word_embeddings"):  # the SDK, before sending
        client.push_weights(str(tied), "v1", probe("v1"))
    with pytest.raises(RaasHTTPError) as refused:  # raas itself, if the SDK is bypassed
        client._call("POST", "/v1/weights/push", json={"version": "v1", "path": str(tied), "probe": probe("v1")})
    assert refused.value.status == 422 and "untie" in refused.value.body["message"]
    assert not any(r.paused for r in rows(service.settings.db_url))  # refused before pausing

    stale = write_checkpoint(tmp_path / "old", "v0-retrained")  # not the trainer's weights
    with pytest.raises(RaasHTTPError) as failed:
        client.push_weights(str(stale), "v1", probe("v1"), timeout=30)
    body = failed.value.body
    assert failed.value.status == 409 and body["error"] == "weight_push_failed"
    assert body["details"]["servers"][0]["check"]["max_abs_diff"] > 1e-3
    assert "POST /v1/llm/resume" in body["message"]
    assert [(r.paused, r.weight_version) for r in rows(service.settings.db_url)] == [(True, "v0")]
    job = client.submit(
        "test-chat", [{"instance_id": "p", "data": {}}], llm=LLM, agent_config={"turns": 2, "observation_words": 5}
    )
    time.sleep(3)
    assert client.job(job.job_id).finished == 0  # nothing runs on the wrong weights
    assert httpx.get(f"{good}/sim/stats").json()["weights"]["body"] == "v0-retrained"

    client.add_llm_server(no_reset, model=SMOLLM2, weight_version="v0")
    # it joins the paused pool paused: the waiting rollout never slips onto its v0 weights
    assert all(r.paused for r in rows(service.settings.db_url))
    good_ckpt = write_checkpoint(tmp_path / "v1", "v1")
    with pytest.raises(RaasHTTPError) as cached:  # one server keeps its prefix cache
        client.push_weights(str(good_ckpt), "v1", probe("v1"), timeout=30)
    by_url = {s["url"]: s for s in cached.value.body["details"]["servers"]}
    assert by_url[good]["ok"] and not by_url[no_reset]["ok"]
    assert all(r.paused for r in rows(service.settings.db_url))  # the good one waits too

    client.remove_llm_server(next(s.id for s in client.llm_servers() if s.url == no_reset))
    report = client.push_weights(str(good_ckpt), "v1", probe("v1"), servers=ids, timeout=30)
    assert report.resumed
    assert service.wait_done(job.job_id, timeout=60).outcomes == {"completed": 1}
    [result] = service.all_results(job.job_id)
    assert result.reward == 1.0 and set(result.policy_versions) == {"v1"}

    probe_file = tmp_path / "probe.json"  # the same from the shell: raas weights ...
    probe_file.write_text(json.dumps(probe("v1")))
    cli = CliRunner()
    ok = cli.invoke(
        weights, ["push", str(good_ckpt), "--version", "v1b", "--probe", str(probe_file), "--url", service.url]
    )
    assert ok.exit_code == 0 and "verified on 1 servers" in ok.output, ok.output
    bad = cli.invoke(weights, ["push", str(stale), "--version", "v3", "--probe", str(probe_file), "--url", service.url])
    assert bad.exit_code == 1 and "FAILED" in bad.output and "/v1/llm/resume" in bad.output
    back = cli.invoke(weights, ["resume", "--version", "v0-retrained", "--url", service.url])
    assert back.exit_code == 0 and "resumed 1 servers" in back.output
    assert [(r.paused, r.weight_version) for r in rows(service.settings.db_url)] == [(False, "v0-retrained")]


@pytest.mark.slow  # ~40 s: the pause must outlast a RUN deadline that fits a loaded machine
def test_a_pause_longer_than_the_run_deadline_costs_the_rollout_nothing(service, sims) -> None:
    """Paused for longer than the whole RUN deadline: the rollout completes on attempt 1 (its
    lease kept beating; the reaper did not time it out) and the wait is not generation time.
    (The session-level twin without the pipeline: tests/llm/test_weights_and_modes.py.)"""
    url = sims(1.0)
    client = service.client
    client.add_llm_server(url, model=SMOLLM2, weight_version="v0")
    job = client.submit(
        "test-chat",
        [{"instance_id": "slow", "data": {}}],
        llm=LLM,
        limits={"run_timeout": 20},
        agent_config={"turns": 4, "observation_words": 5},
    )
    wait_for(lambda: in_flight(url) >= 1, 180, "a turn in flight")
    paused = client.pause_pool(timeout=30)
    assert paused.servers[0].generating_at_pause <= 1  # (it may have ended already)
    assert 0 < paused.pause_seconds < 5  # an in-flight turn finished, nothing aborted
    time.sleep(23)  # longer than the whole RUN deadline plus the reaper's grace (2 s)
    assert client.job(job.job_id).finished == 0
    resumed = client.resume_pool("v1")
    assert [s.weight_version for s in resumed.servers] == ["v1"]
    done = service.wait_done(job.job_id, timeout=60)
    [result] = service.all_results(job.job_id)
    assert done.outcomes == {"completed": 1}, (result.error, result.metrics)
    detail = client.rollout(result.rollout_id)
    assert result.reward == 1.0 and detail.attempt == 1  # lease kept: heartbeats went on
    assert detail.timing.run > 20  # RUN outlived its deadline and still completed
    assert detail.metrics["paused_seconds"] >= 15  # the wait after the in-flight turn
    assert detail.metrics["gen_seconds"] < 20  # the wait is not generation time
    assert [t.weight_version for t in detail.turns][-1] == "v1"
