"""Trainer-side helpers for verified weight pushes: the probe fingerprint and the tie check.

`probe_fingerprint(model, tokenizer)` computes what `POST /v1/weights/push` compares the served
model with: the greedy continuation of a fixed prompt under the trainer's new weights, with
fp32 logprobs. torch is imported only inside it, so this module (and the SDK) imports without
torch. `check_untied(path)` refuses a tied checkpoint for an in-place reload before anything is
sent (raas checks again when it can read the folder).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

# Long enough (> 128 tokens with SmolLM2's tokenizer) that vLLM's prefix cache holds a full
# block of it: a cache not reset after the load then shows in the comparison.
DEFAULT_PROBE_TEXT = (
    "You are checking that an inference server serves the weights a trainer just wrote. "
    "The following paragraph is fixed and only exists to fill a few cache blocks. "
    "Reinforcement learning from rollouts needs the policy that generated each token to be "
    "the policy the trainer thinks it is: the importance ratio between the trainer's new "
    "log-probabilities and the stored ones is only meaningful when both come from the same "
    "weights. A reload that silently keeps part of the old model, a prefix cache that reuses "
    "key and value blocks computed with the old weights, or a server that rounds the update "
    "away in a lower precision all break that assumption without an error message. "
    "Count from one to twelve in words, separated by commas:"
)
UNTIE_HINT = (
    "untie it: save lm_head.weight explicitly (a copy of the embedding matrix) and set "
    "tie_word_embeddings to false in config.json (scripts/untie_checkpoint.py does "
    "both), then serve and train that copy"
)


class TiedCheckpoint(ValueError):
    """The checkpoint ties lm_head to the embeddings: an in-place reload keeps the old head."""


def check_untied(path: str | Path) -> None:
    """TiedCheckpoint if `path/config.json` says `tie_word_embeddings: true` (an unreadable
    or missing config passes: the server-side check and the probe still stand)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return
    if isinstance(config, dict) and config.get("tie_word_embeddings"):
        raise TiedCheckpoint(
            f"{path}/config.json says tie_word_embeddings: true; vLLM's "
            f"in-place reload would leave lm_head at the old weights. "
            f"{UNTIE_HINT}"
        )


def probe_fingerprint(
    model: Any, tokenizer: Any, prompt: str | list[int] | None = None, max_new_tokens: int = 16
) -> dict[str, list]:
    """`{prompt_ids, token_ids, logprobs}`: greedy tokens after `prompt` under `model` (a
    torch causal LM, e.g. transformers'), with their fp32 log-probabilities.

    Stops after the tokenizer's end-of-sequence token if it comes first (the server stops
    there too). Runs under `torch.no_grad()` in eval mode and restores training mode.
    """
    import torch  # lazy: the SDK imports without torch

    if prompt is None:
        prompt = DEFAULT_PROBE_TEXT
    ids = list(prompt) if isinstance(prompt, list) else list(tokenizer(prompt)["input_ids"])
    eos = getattr(tokenizer, "eos_token_id", None)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    tokens: list[int] = []
    logprobs: list[float] = []
    step, past = ids, None  # the prompt once, then one token at a time on the KV cache
    # transformers >= 5.2x names the cache argument `cache`; older ones `past_key_values`.
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    try:
        with torch.no_grad():
            for _ in range(max_new_tokens):
                out = model(
                    torch.tensor([step], device=device), use_cache=True, **({key: past} if past is not None else {})
                )
                past = getattr(out, key, None) or out.past_key_values
                logp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
                token = int(torch.argmax(logp))
                tokens.append(token)
                logprobs.append(float(logp[token]))
                step = [token]
                if token == eos:
                    break
    finally:
        model.train(was_training)
    return {"prompt_ids": ids, "token_ids": tokens, "logprobs": logprobs}


def load_probe(path: str | Path) -> dict[str, list]:
    """A probe fingerprint saved as JSON (`raas weights push --probe FILE`)."""
    probe = json.loads(Path(path).read_text())
    missing = {"prompt_ids", "token_ids", "logprobs"} - set(probe)
    if missing:
        raise ValueError(f"{path}: the probe lacks {sorted(missing)}")
    return probe
