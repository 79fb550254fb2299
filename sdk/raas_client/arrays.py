"""Padded training arrays from rollouts: numpy by default, torch tensors when torch imports.

One row per sample: the prompt then the response, right-padded to the longest row. Every
per-token array is aligned with `input_ids` (position t describes token t):

| key | shape, dtype | what |
| --- | --- | --- |
| `input_ids` | [B, L] int64 | prompt_ids + response_ids, then `pad_id` |
| `attention_mask` | [B, L] int64 | 1 on real tokens, 0 on padding |
| `loss_mask` | [B, L] int64 | the rollout's loss_mask on response tokens (1 = generated), 0 on prompt and padding |
| `old_logprobs` | [B, L] float32 | sampling logprob of a generated token; 0.0 elsewhere |
| `policy_version` | [B, L] int64 | version number that generated the token; -1 elsewhere |
| `prompt_lengths`, `response_lengths` | [B] int64 | real lengths of the two parts |
| `rewards` | [B] float32 | training rewards (`RolloutView.train_reward`, 0 for included failures) |
| `advantages` | [B] float32 | per-sample advantages, when given (broadcast over loss_mask for a token loss) |
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from raas_client.models import RolloutView, version_number

PER_TOKEN = ("input_ids", "attention_mask", "loss_mask", "old_logprobs", "policy_version")
INT_KEYS = ("input_ids", "attention_mask", "loss_mask", "policy_version", "prompt_lengths", "response_lengths")


def token_versions(rollout: RolloutView) -> list[int]:
    """The policy version number of every response token (-1 outside generated turns)."""
    n = len(rollout.response_ids or [])
    out = [-1] * n
    versions = rollout.policy_versions or []
    for k, (start, end) in enumerate(rollout.turn_boundaries):
        number = version_number(versions[k]) if k < len(versions) else None
        if number is not None:
            out[max(0, start) : min(n, end)] = [number] * (min(n, end) - max(0, start))
    return out


def _rows(samples: Sequence[RolloutView], pad_id: int) -> dict[str, list[Any]]:
    prompts = [list(r.prompt_ids or []) for r in samples]
    responses = [list(r.response_ids or []) for r in samples]
    width = max((len(p) + len(q) for p, q in zip(prompts, responses)), default=0)
    rows: dict[str, list[Any]] = {
        k: [] for k in ("input_ids", "attention_mask", "loss_mask", "old_logprobs", "policy_version")
    }
    for r, prompt, response in zip(samples, prompts, responses):
        n, pad = len(prompt) + len(response), width - len(prompt) - len(response)
        mask = list(r.loss_mask or [0] * len(response))
        logprobs = [float(x) for x in (r.response_logprobs or [0.0] * len(response))]
        if len(mask) != len(response) or len(logprobs) != len(response):
            raise ValueError(
                f"rollout {r.rollout_id}: {len(response)} response tokens, "
                f"{len(mask)} loss_mask and {len(logprobs)} logprobs"
            )
        rows["input_ids"].append(prompt + response + [pad_id] * pad)
        rows["attention_mask"].append([1] * n + [0] * pad)
        rows["loss_mask"].append([0] * len(prompt) + mask + [0] * pad)
        rows["old_logprobs"].append(
            [0.0] * len(prompt) + [lp if m else 0.0 for lp, m in zip(logprobs, mask)] + [0.0] * pad
        )
        rows["policy_version"].append([-1] * len(prompt) + token_versions(r) + [-1] * pad)
    rows["prompt_lengths"] = [len(p) for p in prompts]
    rows["response_lengths"] = [len(q) for q in responses]
    return rows


def _backend(choice: str) -> str:
    if choice != "auto":
        return choice
    try:
        import torch  # noqa: F401
    except ImportError:
        return "numpy"
    return "torch"


def to_arrays(
    samples: Sequence[RolloutView],
    pad_id: int = 0,
    rewards: Sequence[float] | None = None,
    advantages: Sequence[float] | None = None,
    backend: Literal["auto", "numpy", "torch"] = "auto",
) -> dict[str, Any]:
    """The table above for `samples`; `backend="auto"` gives torch tensors when torch is
    importable, else numpy arrays (`pip install 'raas-client[arrays]'`)."""
    rows: dict[str, list[Any]] = _rows(samples, pad_id)
    rows["rewards"] = [float(x) for x in (rewards if rewards is not None else [r.train_reward or 0.0 for r in samples])]
    if advantages is not None:
        if len(advantages) != len(samples):
            raise ValueError(f"{len(advantages)} advantages for {len(samples)} samples")
        rows["advantages"] = [float(x) for x in advantages]
    if _backend(backend) == "torch":
        import torch

        tensors = {k: torch.tensor(v, dtype=torch.int64 if k in INT_KEYS else torch.float32) for k, v in rows.items()}
        for key in PER_TOKEN:
            tensors[key] = tensors[key].reshape(len(samples), -1) if samples else tensors[key].reshape(0, 0)
        return tensors
    try:
        import numpy as np
    except ImportError:
        raise ImportError("to_arrays needs numpy (pip install 'raas-client[arrays]') or torch") from None
    out = {k: np.asarray(v, dtype=np.int64 if k in INT_KEYS else np.float32) for k, v in rows.items()}
    for key in PER_TOKEN:
        out[key] = out[key].reshape(len(samples), -1) if samples else out[key].reshape(0, 0)
    return out
