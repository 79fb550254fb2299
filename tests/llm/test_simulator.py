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


# The comparisons below read the engine's own clock (`e2e_seconds`: a request's arrival in the
# engine to its last step), not the client's: on a loaded machine the HTTP round trip and the
# client's threads add delays that have nothing to do with the model, while the engine keeps
# its steps on schedule (it catches up late wake-ups). The fast side of a ratio is the least
# delayed of a few tries; client wall times are only used as lower bounds, which load cannot
# break.


def engine_seconds(url: str, prompts: list[list[int]], max_tokens: int = 64) -> float:
    """Send the prompts at once; their summed seconds inside the engine."""
    before = engine(url).get("e2e_seconds", 0.0)
    timed_completions(url, prompts, max_tokens)
    return engine(url)["e2e_seconds"] - before


def fastest_alone(url: str, prompt: list[int], tries: int = 3) -> float:
    """The engine seconds of `prompt` alone, the least delayed of `tries` (no prefix cache)."""
    return min(engine_seconds(url, [prompt]) for _ in range(tries))


def test_capacity_batch_slows_each_sequence_but_raises_throughput(simulators) -> None:
    url, _ = simulators({"default": [{"ids": list(range(100, 140))}]}, capacity=FAST)
    alone = fastest_alone(url, [1, 2, 3])  # 40 steps of 3 ms
    batch = engine_seconds(url, [[1, 2, k] for k in range(8)]) / 8  # 40 steps of 10 ms each
    assert batch > 2 * alone, (alone, batch)  # each sequence decodes slower (model: 3.3x)...
    assert 8 / batch > 1.5 / alone, (alone, batch)  # ...the server answers more per second (2.4x)
    stats = engine(url)
    assert stats["generation_tokens"] == 11 * 40 and stats["requests_finished"] == 11
    assert set(stats["batch_size_seconds"]) >= {"1", "8"}


def test_capacity_max_num_seqs_queues_the_rest(simulators) -> None:
    url, _ = simulators({"default": [{"ids": list(range(100, 140))}]}, capacity={**FAST, "max_num_seqs": 2})
    timed_completions(url, [[1, 2, k] for k in range(4)])
    stats = engine(url)
    # never more than two at once: 4 x 40 tokens took two batches' steps, the last two waited
    assert max(int(size) for size in stats["batch_size_seconds"]) == 2
    assert stats["steps"] >= 80 and stats["requests_admitted"] == 4
    # the two waited ~40 steps of 4 ms each (0.32 s in all, less how late they were sent)
    assert stats["queue_seconds"] > 0.05, stats


def test_capacity_prefill_costs_per_prompt_token(simulators) -> None:
    url, _ = simulators({"default": [{"ids": [100]}]}, capacity={**FAST, "token_seconds": 0.0005})
    short = fastest_alone(url, list(range(5, 55)))  # one step of ~27 ms
    long = engine_seconds(url, [list(range(5, 1005))])  # one step of ~502 ms
    assert long > 5 * short and long > 0.45, (short, long)
    assert engine(url)["prompt_tokens"] == 3 * 50 + 1000


def test_capacity_prefix_cache_hit_cuts_prefill(simulators) -> None:
    url, _ = simulators(
        {"model": "sim", "default": [{"ids": [100, 101]}]},
        capacity={**FAST, "token_seconds": 0.0005, "prefix_cache_tokens": 4096},
    )
    turn0 = list(range(5, 1005))
    cold = engine_seconds(url, [turn0])  # ~0.5 s of prefill
    turn1 = turn0 + [100, 101] + list(range(7, 27))  # the next turn: previous answer + new tokens
    warm = engine_seconds(url, [turn1])  # prefill of the 30 uncached tokens: ~20 ms
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
