"""Tokenizers named the way vLLM users name models, and servers that do not answer, through
the real service (gateway over HTTP, Celery workers, the LLM simulator: a fake model serving
under a hub id, as `vllm serve HuggingFaceTB/SmolLM2-135M-Instruct` would).

The Hugging Face cache is a folder laid out as huggingface_hub lays it out
(`models--org--name/refs/main`, `snapshots/<rev>/`) holding the committed SmolLM2 tokenizer.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from agents.llm.hub_cache import cached_tokenizer_folder
from fakellm.server import start_simulator
from raas_client import RaasHTTPError
from raas_client.cli import llm
from bench.support.pipeline_harness import start_service

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`
SMOLLM2 = REPO / "tests" / "fixtures" / "smollm2-tokenizer"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
REV = "0123456789abcdef0123456789abcdef01234567"
OBSERVE = '<tool_call>{"name": "observe", "arguments": {}}</tool_call>'


def fake_hub_cache(home: Path) -> Path:
    """HF_HOME with the fixture tokenizer cached as HUB_ID at revision REV."""
    repo = home / "hub" / f"models--{HUB_ID.replace('/', '--')}"
    shutil.copytree(SMOLLM2, repo / "snapshots" / REV)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REV)
    return home


def dead_url() -> str:
    """A loopback URL nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    hf_home = fake_hub_cache(tmp_path_factory.mktemp("hf-home"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HOME", str(hf_home))  # the gateway (this process) and the workers
        mp.delenv("HF_HUB_CACHE", raising=False)
        svc = start_service(
            tmp_path_factory.mktemp("hub-tokenizers"), concurrency=2, handler_modules="tests.sdk.handlers"
        )
        url, stop = start_simulator(str(SMOLLM2), {"model": HUB_ID, "default": [OBSERVE, "\\boxed{4}"]})
        yield svc, url
        stop()
        svc.stop()


def test_the_cache_layout_resolves_offline(service, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(fake_hub_cache(tmp_path)))
    repo = tmp_path / "hub" / f"models--{HUB_ID.replace('/', '--')}"
    assert cached_tokenizer_folder(HUB_ID) == str(repo / "snapshots" / REV)
    assert cached_tokenizer_folder("HuggingFaceTB/not-downloaded") is None
    assert cached_tokenizer_folder("/abs/path") is None


def test_a_server_serving_a_hub_id_runs_rollouts(service):
    svc, url = service  # (Service, simulator url)
    server = svc.client.add_llm_server(url)
    try:
        job = svc.client.submit(
            "test-grpo", [{"instance_id": "h0", "data": {"answer": "4"}}], n_samples=2
        )  # no llm: the pool, tokenizer from its model id
        svc.wait_done(job.job_id, timeout=90)
        rows = svc.all_results(job.job_id)
        assert [(r.outcome, r.reward) for r in rows] == [("completed", 1.0)] * 2, svc.log_tail()
        assert all(r.response_ids and 1 in (r.loss_mask or []) for r in rows)
        named = svc.client.submit(
            "test-grpo",
            [{"instance_id": "h1", "data": {"answer": "4"}}],
            llm={"servers": [{"url": url}], "tokenizer": HUB_ID},
        )
        assert svc.wait_done(named.job_id, timeout=90).outcomes == {"completed": 1}
    finally:
        svc.client.remove_llm_server(server.id)


def test_a_dead_server_is_named_unreachable_in_the_400_and_in_llm_list(service):
    svc, _ = service
    dead = dead_url()
    with pytest.raises(RaasHTTPError) as caught:
        svc.client.submit(
            "test-grpo", [{"instance_id": "d", "data": {"answer": "4"}}], llm={"servers": [{"url": dead}]}
        )
    message = caught.value.body["message"]
    assert caught.value.status == 400 and "did not answer" in message and dead in message
    assert "llm.tokenizer is required" not in message
    assert caught.value.body["details"]["field"] == "llm.servers"

    server = svc.client.add_llm_server(dead)
    try:
        listed = CliRunner().invoke(llm, ["list", "--url", svc.url])
        assert listed.exit_code == 0, listed.output
        line = next(x for x in listed.output.splitlines() if dead in x)
        assert "unreachable (ConnectError" in line and "healthy" not in line
        with pytest.raises(RaasHTTPError) as caught:  # the pool: only the dead server
            svc.client.submit("test-grpo", [{"instance_id": "d", "data": {"answer": "4"}}])
        assert "did not answer" in caught.value.body["message"]
    finally:
        svc.client.remove_llm_server(server.id)


def test_a_model_neither_local_nor_cached_says_where_it_looked(service):
    svc, _ = service
    url, stop = start_simulator(str(SMOLLM2), {"model": "org/never-downloaded"})
    try:
        with pytest.raises(RaasHTTPError) as caught:
            svc.client.submit(
                "test-grpo", [{"instance_id": "n", "data": {"answer": "4"}}], llm={"servers": [{"url": url}]}
            )
    finally:
        stop()
    message = caught.value.body["message"]
    assert "org/never-downloaded" in message and "Hugging Face cache" in message
