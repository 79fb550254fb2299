"""Putting new weights into a running inference server, and checking that it serves them.

Three steps, each an HTTP call to the server's own endpoints (vLLM needs
`VLLM_SERVER_DEV_MODE=1`; runtime LoRA also `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`):

- **apply** by a mechanism registered per (backend, mechanism): vLLM `reload` is
  `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}`; vLLM
  `lora` unloads the fixed adapter name and loads it again from the new folder (see
  `_vllm_lora`); SGLang `reload` is `POST /update_weights_from_disk`.
- **reset the prefix cache**: KV blocks computed with the old weights would otherwise be reused
  by the new ones (a first-token logprob of -1.111 instead of -0.950, measured).
- **verify**: generate greedily from the trainer's probe prompt on the normal generation path
  (so a stale prefix cache shows) and compare ids and logprobs with the trainer's fingerprint.

`tied_embeddings` reads a checkpoint's config: vLLM's in-place reload leaves a tied `lm_head` at
the old weights, so such a checkpoint is refused before anything is paused.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agents.llm.backends import GenerateRequest, ServerError, get_backend_class
from agents.llm.backends.http_client import shared_client
from core.errors import InvalidRequest

UNTIE_HINT = (
    "untie it: save lm_head.weight explicitly (a copy of the embedding matrix) and set "
    "tie_word_embeddings to false in config.json (scripts/untie_checkpoint.py does "
    "both), then serve and train that copy"
)
APPLY_TIMEOUT = 600.0
PROBE_TIMEOUT = 120.0


@dataclass
class Fingerprint:
    """The trainer's probe (validated on the wire by `raas_client.weight_models.Probe`):
    greedy `token_ids` after `prompt_ids` under the new weights, with their `logprobs`."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]


@dataclass
class ProbeCheck:
    """What the server served for the probe, against the fingerprint (see `compare`)."""

    ok: bool
    max_abs_diff: float | None
    first_mismatch: int | None
    served_ids: list[int] = field(default_factory=list)
    served_logprobs: list[float] = field(default_factory=list)


def tied_embeddings(path: str) -> bool | None:
    """`tie_word_embeddings` of the checkpoint's config.json; None if raas cannot read it."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return bool(config.get("tie_word_embeddings", False)) if isinstance(config, dict) else None


def refuse_tied(path: str, mechanism: str) -> None:
    """A full in-place reload of a tied checkpoint is refused, saying how to untie it."""
    if mechanism == "reload" and tied_embeddings(path):
        from core.errors import TiedEmbeddings

        raise TiedEmbeddings(
            f"{path}/config.json says tie_word_embeddings: true; an in-place "
            f"reload would leave lm_head at the old weights. To push it, "
            f"{UNTIE_HINT}",
            field="path",
        )


def _post(url: str, path: str, body: dict, timeout: float) -> None:
    """POST to a server endpoint; any failure is a ServerError naming the endpoint."""
    try:
        response = shared_client().post(f"{url}{path}", json=body, timeout=timeout)
    except Exception as exc:  # httpx errors and timeouts alike: the step did not happen
        raise ServerError(f"{url}{path}: {type(exc).__name__}: {exc}", url=url) from exc
    if response.status_code >= 400:
        raise ServerError(f"{url}{path}: HTTP {response.status_code}: {response.text[:300]}", url=url)


def _vllm_reload(url: str, path: str, lora_name: str | None) -> None:
    """vLLM dev mode: reload a safetensors folder into the running model, in place."""
    _post(url, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": path}}, APPLY_TIMEOUT)


def _vllm_lora(url: str, path: str, lora_name: str | None) -> None:
    """vLLM runtime LoRA under one fixed name: unload it, load it from the new folder.

    Not `load_inplace`: vLLM keeps that flag on the stored request and re-reads the adapter
    from disk on every scheduler step, and its HTTP API can only clear it by unloading the
    name (which gives a new adapter id anyway). Unload + load gives the same fixed name a new
    id, loaded once; the engine keeps older ids in its LRU cache (`--max-cpu-loras`, set it to
    max_staleness + 1) and the API server only the newest.
    """
    try:
        _post(url, "/v1/unload_lora_adapter", {"lora_name": lora_name}, APPLY_TIMEOUT)
    except ServerError as exc:
        if "HTTP 404" not in exc.message and "HTTP 400" not in exc.message:
            raise  # 404/400: not loaded yet (first push)
    _post(url, "/v1/load_lora_adapter", {"lora_name": lora_name, "lora_path": path}, APPLY_TIMEOUT)


def _sglang_reload(url: str, path: str, lora_name: str | None) -> None:
    """SGLang: reload a checkpoint folder in place (it flushes its cache itself)."""
    _post(url, "/update_weights_from_disk", {"model_path": path}, APPLY_TIMEOUT)


MECHANISMS: dict[tuple[str, str], Callable[[str, str, str | None], None]] = {
    ("vllm", "reload"): _vllm_reload,
    ("vllm", "lora"): _vllm_lora,
    ("sglang", "reload"): _sglang_reload,
}
CACHE_RESETS = {"vllm": "/reset_prefix_cache", "sglang": "/flush_cache"}


def check_mechanism(backend: str, mechanism: str) -> None:
    """InvalidRequest naming the pairs raas knows, if (backend, mechanism) is not one."""
    if (backend, mechanism) not in MECHANISMS:
        known = ", ".join(f"{b}:{m}" for b, m in MECHANISMS)
        raise InvalidRequest(
            f"mechanism: {mechanism!r} is not supported for a {backend} server (supported: {known})", field="mechanism"
        )


def apply_weights(url: str, backend: str, mechanism: str, path: str, lora_name: str | None = None) -> float:
    """Load the weights at `path` into the server; returns the seconds it took."""
    check_mechanism(backend, mechanism)
    started = time.monotonic()
    MECHANISMS[(backend, mechanism)](url, path, lora_name)
    return time.monotonic() - started


def reset_prefix_cache(url: str, backend: str) -> None:
    """Drop every cached KV block, so nothing computed with the old weights is reused."""
    _post(url, CACHE_RESETS.get(backend, "/reset_prefix_cache"), {}, 60.0)


def serve_probe(url: str, backend: str, model: str | None, probe: Fingerprint) -> tuple[list[int], list[float]]:
    """Greedy ids and logprobs the server generates after the probe prompt (generation path:
    the prefix cache takes part, as for a rollout's turn)."""
    request = GenerateRequest(
        prompt_ids=list(probe.prompt_ids),
        max_tokens=len(probe.token_ids),
        sampling={"temperature": 0.0, "top_p": 1.0, "top_k": -1},
        timeout=PROBE_TIMEOUT,
        model=model,
    )
    generation = get_backend_class(backend)().generate(url, request)
    return list(generation.token_ids), [float(x) for x in generation.logprobs or []]


def compare(probe: Fingerprint, ids: list[int], logprobs: list[float], tolerance: float) -> ProbeCheck:
    """Served vs fingerprint: same ids, and every logprob within `tolerance`."""
    first = next((i for i, (a, b) in enumerate(zip(ids, probe.token_ids)) if a != b), None)
    if first is None and len(ids) != len(probe.token_ids):
        first = min(len(ids), len(probe.token_ids))
    agree = len(probe.token_ids) if first is None else first
    diffs = [abs(a - b) for a, b in zip(logprobs[:agree], probe.logprobs[:agree])]
    worst = max(diffs) if diffs else None
    ok = first is None and worst is not None and worst <= tolerance
    return ProbeCheck(ok=ok, max_abs_diff=worst, first_mismatch=first, served_ids=ids, served_logprobs=logprobs)


def verify(url: str, backend: str, model: str | None, probe: Fingerprint, tolerance: float) -> ProbeCheck:
    """Run the probe on the server and compare it with the trainer's fingerprint."""
    ids, logprobs = serve_probe(url, backend, model, probe)
    return compare(probe, ids, logprobs, tolerance)
