"""The LLM simulator's weights (a fake, named as such): vLLM's weight-update endpoints, and
logprobs that depend on the weights a push loaded, so a wrong or missing push shows.

Endpoints (the subset of vLLM dev mode that `agents.llm.weights` uses):
`POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}`,
`POST /reset_prefix_cache`, `POST /v1/load_lora_adapter {lora_name, lora_path}`,
`POST /v1/unload_lora_adapter {lora_name}`.

A weights folder holds `sim_weights.json` `{"seed": "<any string>"}` (what its "weights" are)
and optionally a `config.json`. The weights have two parts, like a model's body and its
`lm_head`: a reload sets both to the folder's seed, except when `config.json` says
`tie_word_embeddings: true`: then the head keeps its old seed, vLLM's tied-embedding defect.
Before any load the simulator serves the classic `fake_logprob`s (nothing changes for tests
that never push). After a load every sampled token's logprob is a deterministic function of
(body seed, head seed, token, position): `fingerprint_logprobs` is the trainer's side.

A prefix cache: every full block (16 tokens) of a prompt is remembered with the weights it
was computed with; a later prompt sharing a cached block is served with those weights (stale
logprobs after a reload) until `POST /reset_prefix_cache`. Script options
(`"weights": {...}`): `"reset_noop": true` makes the reset answer 200 and do nothing (a server
whose cache survives; the defect a push must catch).
"""

from __future__ import annotations

import json
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WEIGHTS_FILE = "sim_weights.json"
BLOCK_TOKENS = 16
MAX_CACHED_BLOCKS = 200_000


@dataclass(frozen=True)
class WeightState:
    """The seeds of the two parts of the simulated weights (None: never loaded)."""

    body: str | None = None
    head: str | None = None

    @property
    def loaded(self) -> bool:
        """True once any weights were loaded."""
        return self.body is not None or self.head is not None


def weights_logprob(state: WeightState, token_id: int, position: int) -> float:
    """The logprob a model with these weights gives `token_id` at `position`, in (-3, 0]."""
    digest = zlib.crc32(f"{state.body}|{state.head}|{token_id}|{position}".encode())
    return -(digest % 997) / 997.0 * 3.0


def read_seed(folder: str | Path) -> str:
    """The seed of a simulated checkpoint folder; ValueError if it is not one."""
    try:
        data = json.loads((Path(folder) / WEIGHTS_FILE).read_text())
        return str(data["seed"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{folder}: no readable {WEIGHTS_FILE} with a seed ({exc})") from exc


def is_tied(folder: str | Path) -> bool:
    """Whether the folder's config.json ties the head to the embeddings."""
    try:
        return bool(json.loads((Path(folder) / "config.json").read_text()).get("tie_word_embeddings", False))
    except (OSError, ValueError, AttributeError):
        return False


def write_checkpoint(folder: str | Path, seed: str, tied: bool = False) -> Path:
    """Write a simulated checkpoint (the trainer's "save_pretrained" in tests)."""
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    (path / WEIGHTS_FILE).write_text(json.dumps({"seed": seed}))
    (path / "config.json").write_text(json.dumps({"tie_word_embeddings": tied}))
    return path


def fingerprint_logprobs(seed: str, prompt_ids: list[int], token_ids: list[int]) -> list[float]:
    """The trainer's side: logprobs of `token_ids` after `prompt_ids` under weights `seed`."""
    state = WeightState(seed, seed)
    return [weights_logprob(state, t, len(prompt_ids) + i) for i, t in enumerate(token_ids)]


def fingerprint(seed: str, prompt_ids: list[int], token_ids: list[int]) -> dict[str, list]:
    """A probe `{prompt_ids, token_ids, logprobs}` for weights `seed` (the simulator's greedy
    answer to `prompt_ids` is its scripted reply: pass its ids as `token_ids`)."""
    return {
        "prompt_ids": list(prompt_ids),
        "token_ids": list(token_ids),
        "logprobs": fingerprint_logprobs(seed, prompt_ids, token_ids),
    }


class SimWeights:
    """The simulator's current weights, its LoRA adapters and its prefix cache."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        options = options or {}
        self.reset_noop = bool(options.get("reset_noop", False))
        self.state = WeightState()
        self.adapters: dict[str, WeightState] = {}
        self.cache: dict[tuple[str | None, int, int], WeightState] = {}
        self.counts = {"reloads": 0, "resets": 0, "lora_loads": 0, "lora_unloads": 0}
        self.lock = threading.Lock()

    def handle(self, path: str, body: dict[str, Any]) -> tuple[int, Any] | None:
        """Answer a weights endpoint; None if `path` is not one."""
        routes = {
            "/collective_rpc": self._rpc,
            "/reset_prefix_cache": self._reset,
            "/v1/load_lora_adapter": self._load_lora,
            "/v1/unload_lora_adapter": self._unload_lora,
        }
        route = routes.get(path)
        return None if route is None else route(body)

    def _rpc(self, body: dict[str, Any]) -> tuple[int, Any]:
        if body.get("method") != "reload_weights":
            return 400, {"error": f"the simulator only knows reload_weights, not {body.get('method')!r}"}
        folder = (body.get("kwargs") or {}).get("weights_path")
        try:
            seed = read_seed(folder)
        except ValueError as exc:
            return 500, {"error": str(exc)}
        with self.lock:
            # A tied checkpoint: the embeddings reload, the head keeps the old weights.
            head = self.state.head if is_tied(folder) else seed
            self.state = WeightState(seed, head)
            self.counts["reloads"] += 1
        return 200, {"results": [None]}

    def _reset(self, body: dict[str, Any]) -> tuple[int, Any]:
        with self.lock:
            self.counts["resets"] += 1
            if not self.reset_noop:
                self.cache.clear()
        return 200, {"success": True}

    def _load_lora(self, body: dict[str, Any]) -> tuple[int, Any]:
        name, folder = body.get("lora_name"), body.get("lora_path")
        if not name or not folder:
            return 400, {"error": "Both 'lora_name' and 'lora_path' must be provided."}
        with self.lock:
            if name in self.adapters and not body.get("load_inplace"):
                return 400, {"error": f"The lora adapter '{name}' has already been loaded."}
        try:
            seed = read_seed(folder)
        except ValueError as exc:
            return 404, {"error": str(exc)}
        with self.lock:
            self.adapters[name] = WeightState(seed, seed)
            self.counts["lora_loads"] += 1
        return 200, f"Success: LoRA adapter '{name}' added successfully."

    def _unload_lora(self, body: dict[str, Any]) -> tuple[int, Any]:
        name = body.get("lora_name")
        with self.lock:
            if name not in self.adapters:
                return 404, {"error": f"The lora adapter '{name}' cannot be found."}
            del self.adapters[name]
            self.counts["lora_unloads"] += 1
        return 200, f"Success: LoRA adapter '{name}' removed successfully."

    def logprobs(self, prompt_ids: list[int], ids: list[int], model: str | None = None) -> list[float] | None:
        """Logprobs of `ids` after `prompt_ids` with the weights serving `model` (a LoRA name
        or the base), through the prefix cache; None before any weights were loaded."""
        with self.lock:
            state = self.adapters.get(model or "", self.state)
            adapter = model if model in self.adapters else None
            used = self._through_cache(adapter, prompt_ids, state)
        if not used.loaded:
            return None
        base = len(prompt_ids)
        return [weights_logprob(used, t, base + i) for i, t in enumerate(ids)]

    def _through_cache(self, adapter: str | None, prompt_ids: list[int], state: WeightState) -> WeightState:
        """The weights the prompt's longest cached block was computed with (else `state`);
        every full block of the prompt is cached with what was used."""
        blocks = (len(prompt_ids) - 1) // BLOCK_TOKENS  # the last token is always computed
        keys, chained = [], 0
        for k in range(blocks):  # a block's key covers every token before it, as vLLM's does
            chained = hash((chained, tuple(prompt_ids[k * BLOCK_TOKENS : (k + 1) * BLOCK_TOKENS])))
            keys.append((adapter, k, chained))
        used = next((self.cache[key] for key in reversed(keys) if key in self.cache), state)
        if len(self.cache) > MAX_CACHED_BLOCKS:  # a bounded cache, like the real one
            self.cache.clear()
        for key in keys:
            self.cache.setdefault(key, used)
        return used

    def snapshot(self) -> dict[str, Any]:
        """What /sim/stats reports about the weights."""
        with self.lock:
            return {
                **self.counts,
                "body": self.state.body,
                "head": self.state.head,
                "adapters": sorted(self.adapters),
                "cached_blocks": len(self.cache),
            }
