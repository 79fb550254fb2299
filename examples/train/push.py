"""Push new weights to the served policy: pause the raas pool, load, reset, verify, resume.

`push_weights` is the one place that talks to vLLM's dev endpoints (`VLLM_SERVER_DEV_MODE=1`)
directly; `push_via_service` hands the same job to the service's verified push
(`POST /v1/weights/push`, SDK `RaasClient.push_weights`) where the SDK has it (`train.py
--push service`). Either way the order is the one the traps measured on the CPU vLLM dictate
(docs/weights.md, "Traps the verification catches"):
1. raas pauses the server: new generations wait, the ones in flight finish (nothing aborted);
2. the server loads the folder in place (`reload_weights`), or the LoRA adapter under its one
   fixed name (`load_inplace`);
3. `/reset_prefix_cache`: otherwise new weights run on KV blocks the old weights computed;
4. verify: greedy logprobs of a fixed probe from the server must match the trainer's within
   `tolerance`, else raise with the server still paused (nothing resumes on wrong weights);
5. raas resumes the server with the new `weight_version`, recorded on every later turn.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import httpx

PROBE_TOKENS = 8


class PushFailed(RuntimeError):
    """The served model does not match the trained one; the server stays paused."""


@dataclass
class PushFigures:
    """Seconds per part of one push, and the probe's worst |served - trained| logprob."""

    pause_seconds: float
    load_seconds: float
    probe_gap: float


def _wait_idle(raas: Any, server_id: str, timeout: float = 600) -> None:
    """Until the paused server has nothing in flight (turns that had started, finished)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        server = next(s for s in raas.llm_servers() if s.id == server_id)
        if server.in_flight == 0:
            return
        time.sleep(0.1)
    raise PushFailed(f"server {server_id} still busy {timeout:.0f}s after the pause")


def _load(vllm: httpx.Client, path: str, lora_name: str | None) -> None:
    """Apply the saved weights on the server (full reload in place, or the adapter)."""
    if lora_name:
        body = {"lora_name": lora_name, "lora_path": path, "load_inplace": True}
        resp = vllm.post("/v1/load_lora_adapter", json=body)
    else:
        body = {"method": "reload_weights", "kwargs": {"weights_path": path}}
        resp = vllm.post("/collective_rpc", json=body)
    resp.raise_for_status()
    vllm.post("/reset_prefix_cache").raise_for_status()


def probe_gap(
    vllm: httpx.Client,
    model_name: str,
    prompt_ids: list[int],
    trainer_logprobs: Callable[[list[int], list[int]], list[float]],
) -> float:
    """Greedy-generate a few probe tokens on the server; the worst |served - trainer| logprob
    of them (the served generation path: `prompt_logprobs` would bypass the prefix cache)."""
    body = {
        "model": model_name,
        "prompt": prompt_ids,
        "max_tokens": PROBE_TOKENS,
        "temperature": 0.0,
        "logprobs": 0,
        "return_token_ids": True,
    }
    choice = vllm.post("/v1/completions", json=body).raise_for_status().json()["choices"][0]
    served = choice["logprobs"]["token_logprobs"]
    mine = trainer_logprobs(prompt_ids, choice["token_ids"])
    return max(abs(a - b) for a, b in zip(served, mine))


def push_weights(
    raas: Any,
    server_id: str,
    vllm_url: str,
    path: str,
    version: str,
    *,
    model_name: str,
    probe_ids: list[int],
    trainer_logprobs: Callable[[list[int], list[int]], list[float]],
    lora_name: str | None = None,
    tolerance: float = 1e-3,
) -> PushFigures:
    """Pause, load `path`, reset the prefix cache, verify the probe, resume as `version`."""
    paused = time.monotonic()
    raas.pause_llm_server(server_id)
    _wait_idle(raas, server_id)
    with httpx.Client(base_url=vllm_url, timeout=900) as vllm:  # slow under load, not hung
        started = time.monotonic()
        _load(vllm, path, lora_name)
        loaded = time.monotonic() - started
        gap = probe_gap(vllm, lora_name or model_name, probe_ids, trainer_logprobs)
    if gap > tolerance:
        raise PushFailed(
            f"served logprobs differ from the trainer's by {gap:.3g} > {tolerance} "
            f"after loading {path}; server {server_id} stays paused"
        )
    raas.resume_llm_server(server_id, weight_version=version)
    return PushFigures(time.monotonic() - paused, loaded, gap)


def push_via_service(
    raas: Any, path: str, version: str, probe: dict[str, list], *, lora_name: str | None = None, tolerance: float = 1e-3
) -> PushFigures:
    """`RaasClient.push_weights`: the service pauses the pool, loads, resets the cache, checks
    the probe on every server and resumes as `version` (409 and still paused if not)."""
    started = time.monotonic()
    result = raas.push_weights(
        path, version, probe, mechanism="lora" if lora_name else "reload", lora_name=lora_name, tolerance=tolerance
    )
    gap = max((s.check.max_abs_diff or 0.0 for s in result.servers if s.check is not None), default=0.0)
    load = max((s.load_seconds or 0.0 for s in result.servers), default=0.0)
    return PushFigures(result.total_seconds or time.monotonic() - started, load, gap)
