"""The LLM simulator over real HTTP: token-id completions, instances, turns, limits, CLI."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from tokenizers import Tokenizer

from fakellm.capacity import parse_metrics
from fakellm.script import fake_logprob
from fakellm.server import start_simulator_process
from core.errors import ConfigError
from tests.llm.conftest import SMOLLM2

SCRIPT = {
    "model": "sim-model",
    "default": ["default reply"],
    "by_instance": {"instance-7": ["first", "second"], "raw": [{"ids": [28, 29]}]},
}


@pytest.fixture
def tok() -> Tokenizer:
    return Tokenizer.from_file(f"{SMOLLM2}/tokenizer.json")


def prompt(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def complete(url: str, ids: list[int], max_tokens: int = 50) -> dict:
    body = {"model": "sim-model", "prompt": ids, "max_tokens": max_tokens, "logprobs": 0, "return_token_ids": True}
    return httpx.post(f"{url}/v1/completions", json=body).json()["choices"][0]


def test_models_health_and_scripted_turns(simulators, tok) -> None:
    url, _ = simulators(SCRIPT)
    assert httpx.get(f"{url}/health").status_code == 200
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "sim-model"
    turn0 = "<|im_start|>user\nsolve instance-7<|im_end|>\n<|im_start|>assistant\n"
    choice = complete(url, prompt(tok, turn0))
    assert choice["token_ids"] == prompt(tok, "first") + [2] and choice["finish_reason"] == "stop"
    assert choice["logprobs"]["token_logprobs"] == [
        fake_logprob(t, len(prompt(tok, turn0)) + i) for i, t in enumerate(choice["token_ids"])
    ]
    turn1 = turn0 + "first<|im_end|>\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n"
    assert complete(url, prompt(tok, turn1))["token_ids"] == prompt(tok, "second") + [2]
    assert complete(url, prompt(tok, "<|im_start|>assistant\nraw"))["token_ids"] == [28, 29]
    assert complete(url, prompt(tok, "other"))["text"] == "default reply"
    stats = httpx.get(f"{url}/sim/stats").json()
    assert stats["requests"] == 4 and stats["instance:instance-7"] == 2
    assert stats["turn:instance-7:0"] == stats["turn:instance-7:1"] == 1  # answers per turn


def test_max_tokens_and_max_model_len(simulators, tok) -> None:
    url, _ = simulators(SCRIPT, max_model_len=40)
    choice = complete(url, prompt(tok, "x"), max_tokens=1)
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 1
    body = {"prompt": prompt(tok, "x"), "max_tokens": 100}
    assert httpx.post(f"{url}/v1/completions", json=body).status_code == 400


def test_sglang_generate_route(simulators, tok) -> None:
    url, _ = simulators(SCRIPT)
    body = {"input_ids": prompt(tok, "instance-7"), "return_logprob": True, "sampling_params": {"max_new_tokens": 10}}
    answer = httpx.post(f"{url}/generate", json=body).json()
    assert [e[1] for e in answer["meta_info"]["output_token_logprobs"]] == answer["output_ids"]
    assert answer["meta_info"]["finish_reason"]["type"] == "stop"


def test_cli_subprocess(tmp_path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url, stop = start_simulator_process(SMOLLM2, script, port, capacity={"time_scale": 0.01})
    try:
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "sim-model"
        assert complete(url, [1, 2, 3])["text"] == "default reply"
        metrics = parse_metrics(httpx.get(f"{url}/metrics").text)  # --capacity reached it
        assert metrics['vllm:request_success_total{model_name="sim-model"}'] == 1
    finally:
        stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health")


# --- capacity model (fakellm/capacity.py): timings through real HTTP, small constants

FAST = {"step_seconds": 0.002, "token_seconds": 0.001, "prefix_cache_tokens": 0}


def timed_completions(url: str, prompts: list[list[int]], max_tokens: int = 64) -> list[float]:
    """Send the prompts at once; each request's wall seconds, in prompt order."""

    def one(ids: list[int]) -> float:
        t0 = time.monotonic()
        response = client.post(f"{url}/v1/completions", json={"prompt": ids, "max_tokens": max_tokens})
        assert response.status_code == 200, response.text
        return time.monotonic() - t0

    with (
        httpx.Client(timeout=30, limits=httpx.Limits(max_connections=64)) as client,
        ThreadPoolExecutor(len(prompts)) as pool,
    ):
        return list(pool.map(one, prompts))


def engine(url: str) -> dict:
    return httpx.get(f"{url}/sim/stats").json()["engine"]


def test_capacity_batch_slows_each_sequence_but_raises_throughput(simulators) -> None:
    url, _ = simulators({"default": [{"ids": list(range(100, 140))}]}, capacity=FAST)
    alone = timed_completions(url, [[1, 2, 3]])[0]  # 40 steps of 3 ms
    batch = timed_completions(url, [[1, 2, k] for k in range(8)])  # 40 steps of 10 ms
    assert min(batch) > 2 * alone, (alone, batch)  # each sequence decodes slower...
    assert 8 / max(batch) > 1.5 / alone, (alone, batch)  # ...the server answers more per second
    stats = engine(url)
    assert stats["generation_tokens"] == 9 * 40 and stats["requests_finished"] == 9
    assert set(stats["batch_size_seconds"]) >= {"1", "8"}


def test_capacity_max_num_seqs_queues_the_rest(simulators) -> None:
    url, _ = simulators({"default": [{"ids": list(range(100, 140))}]}, capacity={**FAST, "max_num_seqs": 2})
    latencies = sorted(timed_completions(url, [[1, 2, k] for k in range(4)]))
    assert latencies[2] > 1.6 * latencies[1], latencies  # the last two waited for a slot
    stats = engine(url)
    assert stats["queue_seconds"] > latencies[0] and stats["requests_admitted"] == 4
    assert max(int(size) for size in stats["batch_size_seconds"]) == 2


def test_capacity_prefill_costs_per_prompt_token(simulators) -> None:
    url, _ = simulators({"default": [{"ids": [100]}]}, capacity={**FAST, "token_seconds": 0.0005})
    short = timed_completions(url, [list(range(5, 55))])[0]  # one step of ~27 ms
    long = timed_completions(url, [list(range(5, 1005))])[0]  # one step of ~502 ms
    assert long > 5 * short and long > 0.45, (short, long)
    assert engine(url)["prompt_tokens"] == 1050


def test_capacity_prefix_cache_hit_cuts_prefill(simulators) -> None:
    url, _ = simulators(
        {"model": "sim", "default": [{"ids": [100, 101]}]},
        capacity={**FAST, "token_seconds": 0.0005, "prefix_cache_tokens": 4096},
    )
    turn0 = list(range(5, 1005))
    cold = timed_completions(url, [turn0])[0]
    turn1 = turn0 + [100, 101] + list(range(7, 27))  # the next turn: previous answer + new tokens
    warm = timed_completions(url, [turn1])[0]
    assert warm < cold / 3, (cold, warm)
    stats = engine(url)
    assert stats["prefix_cache_hits"] == 992  # 1002 tokens cached, in whole 16-token blocks
    assert stats["prefix_cache_queries"] == 1000 + 1022
    metrics = parse_metrics(httpx.get(f"{url}/metrics").text)
    assert metrics['vllm:prefix_cache_hits_total{model_name="sim"}'] == 992
    assert metrics['vllm:num_requests_running{model_name="sim"}'] == 0
    assert metrics['sim:busy_seconds_total{model_name="sim"}'] > 0


def test_capacity_config_errors_name_the_field(simulators) -> None:
    with pytest.raises(ConfigError, match="capacity.max_num_seqs"):
        simulators(SCRIPT, capacity={"max_num_seqs": 0})
    with pytest.raises(ConfigError, match="capacity.tokens_per_second"):
        simulators(SCRIPT, capacity={"tokens_per_second": 5})
    url, _ = simulators(SCRIPT)  # off by default: no engine, no /metrics
    assert httpx.get(f"{url}/metrics").status_code == 404
    assert "engine" not in httpx.get(f"{url}/sim/stats").json()
