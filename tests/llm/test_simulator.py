"""The LLM simulator over real HTTP: token-id completions, instances, turns, limits, CLI."""
from __future__ import annotations

import json
import socket

import httpx
import pytest
from tokenizers import Tokenizer

from agents.llm.simulator import fake_logprob, start_simulator_process
from tests.llm.conftest import SMOLLM2

SCRIPT = {"model": "sim-model", "default": ["default reply"],
          "by_instance": {"instance-7": ["first", "second"], "raw": [{"ids": [28, 29]}]}}


@pytest.fixture
def tok() -> Tokenizer:
    return Tokenizer.from_file(f"{SMOLLM2}/tokenizer.json")


def prompt(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def complete(url: str, ids: list[int], max_tokens: int = 50) -> dict:
    body = {"model": "sim-model", "prompt": ids, "max_tokens": max_tokens, "logprobs": 0,
            "return_token_ids": True}
    return httpx.post(f"{url}/v1/completions", json=body).json()["choices"][0]


def test_models_health_and_scripted_turns(simulators, tok) -> None:
    url, _ = simulators(SCRIPT)
    assert httpx.get(f"{url}/health").status_code == 200
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "sim-model"
    turn0 = "<|im_start|>user\nsolve instance-7<|im_end|>\n<|im_start|>assistant\n"
    choice = complete(url, prompt(tok, turn0))
    assert choice["token_ids"] == prompt(tok, "first") + [2] and choice["finish_reason"] == "stop"
    assert choice["logprobs"]["token_logprobs"] == [
        fake_logprob(t, len(prompt(tok, turn0)) + i) for i, t in enumerate(choice["token_ids"])]
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
    body = {"input_ids": prompt(tok, "instance-7"), "return_logprob": True,
            "sampling_params": {"max_new_tokens": 10}}
    answer = httpx.post(f"{url}/generate", json=body).json()
    assert [e[1] for e in answer["meta_info"]["output_token_logprobs"]] == answer["output_ids"]
    assert answer["meta_info"]["finish_reason"]["type"] == "stop"


def test_cli_subprocess(tmp_path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url, stop = start_simulator_process(SMOLLM2, script, port)
    try:
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "sim-model"
    finally:
        stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health")
