"""vLLM tier of the ProRL drop-in: the routes as NeMo RL drives them, against a real model.

    scripts/serve_vllm_cpu.sh models/smollm2-135m-instruct 8011 &
    RAAS_VLLM_URL=http://127.0.0.1:8011 .venv/bin/python -m pytest -m vllm \\
        tests/agents/test_prorl_vllm.py

What a small model answers is whatever it is; what must hold is ProRL's shape: every message
has token_ids that concatenate to prompt + response, each turn obeys max_output_tokens, and a
cancel returns at once instead of waiting for the model to finish its turn.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import httpx
import pytest

from tests.agents.test_prorl_clients import NEMO_RL_SAMPLING, NO_ENV, SOLVED, check_token_shape
from bench.support.pipeline_harness import start_service

pytestmark = [pytest.mark.service, pytest.mark.vllm]
VLLM_URL = os.environ.get("RAAS_VLLM_URL", "").rstrip("/")


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    if not VLLM_URL:
        pytest.fail("RAAS_VLLM_URL is not set: the vllm tier needs a real server")
    svc = start_service(tmp_path_factory.mktemp("prorl-vllm"), concurrency=2)
    client = httpx.Client(base_url=svc.url, timeout=900)
    assert client.post("/start").status_code == 200
    assert client.post("/add_llm_server", json={"address": f"{VLLM_URL}/v1"}).status_code == 200
    yield client
    client.post("/stop")
    client.close()
    svc.stop()


def process(http: httpx.Client, sampling: dict[str, Any], **extra: Any) -> dict[str, Any]:
    response = http.post(
        "/process",
        json={"instance": {**SOLVED, "trajectory_id": 5}, "sampling_params": sampling, "agent_config": NO_ENV, **extra},
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_prorl_shape_against_a_real_model(http) -> None:
    sampling = {
        **NEMO_RL_SAMPLING,
        "max_iterations": 3,
        "max_output_tokens": 48,
        "max_input_tokens": 1536,
        "max_model_len": 2048,
    }
    result = process(http, sampling)
    assert result["trajectory_id"] == 5 and result["critical_error"] is None, result["error"]
    check_token_shape(result)
    assert all(len(m["token_ids"]) <= 48 for m in result["messages"] if m["role"] == "assistant")


def test_cancel_returns_without_waiting_for_the_turn(http) -> None:
    answer: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: answer.update(
            result=process(http, {"max_output_tokens": 1500, "max_model_len": 2048}, job_id="vllm-cancel")
        )
    )
    thread.start()
    started = time.monotonic()
    while running_requests() == 0 and time.monotonic() - started < 120:
        time.sleep(0.2)
    time.sleep(1)  # the first (long, CPU) generation is being decoded
    cancel_at = time.monotonic()
    http.post("/cancel", json={"job_id": "vllm-cancel"})
    thread.join(timeout=60)
    assert not thread.is_alive() and time.monotonic() - cancel_at < 15
    assert answer["result"]["outcome"] == "cancelled" and answer["result"]["filter"] is True
    assert running_requests() == 0  # vLLM stopped decoding: the request was aborted


def running_requests() -> float:
    """vLLM's own gauge of requests being decoded."""
    for line in httpx.get(f"{VLLM_URL}/metrics").text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            return float(line.split()[-1])
    raise AssertionError("vLLM /metrics has no vllm:num_requests_running")
