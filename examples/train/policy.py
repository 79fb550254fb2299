"""The trained policy in torch (CPU, float32): load, per-token logprobs, GRPO loss, one step.

Full fine-tune or LoRA (peft). What is written here rather than taken from a library, and why:
- the loss (`grpo_loss`, 20 lines): TRL's GRPO loss lives inside its trainer, which generates
  its own completions; raas hands us finished token-exact rollouts with the behaviour policy's
  logprobs, which is exactly the input of PPO's clipped objective;
- `token_logprobs`: a gather over log-softmax, micro-batched so 32 sequences x 49k-token vocab
  fit in memory on a laptop-sized machine.
Optimiser (AdamW), gradient clipping and LoRA come from torch and peft.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpo import Sample


@dataclass
class StepFigures:
    """What one optimiser step measured (CSV columns)."""

    loss: float
    clip_fraction: float
    logprob_gap: float  # mean |trainer - stored| logprob over trained tokens, before the update
    ratio_mean: float
    tokens: int
    grad_norm: float
    seconds: float


def load_policy(model_dir: str, lora_rank: int = 0, threads: int | None = None) -> Any:
    """The model in float32 and train mode; with `lora_rank` > 0, a peft LoRA around it."""
    from transformers import AutoModelForCausalLM

    if threads:
        torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if model.config.tie_word_embeddings:
        raise ValueError(
            f"{model_dir} ties lm_head to the embeddings: an in-place reload would "
            "keep the old lm_head; build an untied copy with scripts/untie_checkpoint.py"
        )
    if lora_rank > 0:
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(
            r=lora_rank,
            lora_alpha=2 * lora_rank,
            lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        )
        model = get_peft_model(model, config)
    model.train()  # SmolLM2 has no dropout: train mode changes nothing numerically
    return model


def _padded(samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(input ids, attention mask, response mask, stored logprobs, longest prompt) right-padded;
    the response occupies positions [len(prompt), len(prompt)+len(response))."""
    width = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.long)
    attention = torch.zeros(len(samples), width, dtype=torch.long)
    mask = torch.zeros(len(samples), width)
    old = torch.zeros(len(samples), width)
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        ids[i, : p + r] = torch.tensor(s.prompt_ids + s.response_ids)
        attention[i, : p + r] = 1
        mask[i, p : p + r] = torch.tensor(s.loss_mask, dtype=torch.float32)
        old[i, p : p + r] = torch.tensor(s.response_logprobs)
    return ids, attention, mask, old, width


def token_logprobs(
    model: Any, ids: torch.Tensor, attention: torch.Tensor, wanted: torch.Tensor | None = None
) -> torch.Tensor:
    """log p(token t | tokens < t) at every position t >= 1 where `wanted` is set (all by
    default); 0 elsewhere and at position 0.

    The head runs only at the wanted positions: with a 49k-token vocabulary, the lm_head and
    the log-softmax over prompt and padding positions are a large share of a step on CPU.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    hidden = base.model(input_ids=ids, attention_mask=attention).last_hidden_state[:, :-1]
    select = (wanted if wanted is not None else torch.ones_like(ids))[:, 1:] > 0
    logits = base.lm_head(hidden[select]).float()
    picked = logits.gather(1, ids[:, 1:][select][:, None]).squeeze(1)
    out = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=logits.dtype)
    out[select] = picked - torch.logsumexp(logits, dim=-1)
    return torch.cat([torch.zeros(ids.shape[0], 1, dtype=logits.dtype), out], dim=1)


def grpo_loss(
    new: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, clip: float, normaliser: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate summed over masked tokens / `normaliser` (the step's trained
    tokens: a token-level mean over the whole step, so micro-batches add up to it), and the
    number of tokens where the clipped branch was taken. `grpo.clipped_surrogate` is the
    numpy reference."""
    ratio = torch.exp(new - old)
    adv = advantages[:, None]
    unclipped, clipped = ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv
    loss = (-torch.minimum(unclipped, clipped) * mask).sum() / normaliser
    return loss, ((clipped < unclipped) & (mask > 0)).sum()


def train_step(
    model: Any,
    optimizer: torch.optim.Optimizer,
    samples: list[Sample],
    clip: float = 0.2,
    max_grad_norm: float = 1.0,
    micro_batch: int = 8,
) -> StepFigures:
    """One optimiser step on `samples` (gradients accumulated over micro-batches)."""
    started = time.monotonic()
    total = sum(sum(s.loss_mask) for s in samples)
    optimizer.zero_grad(set_to_none=True)
    loss_sum = clipped = gap = ratio_sum = 0.0
    # Similar lengths together: less padding computed.
    ordered = sorted(samples, key=lambda s: len(s.prompt_ids) + len(s.response_ids))
    for start in range(0, len(ordered), micro_batch):
        chunk = ordered[start : start + micro_batch]
        ids, attention, mask, old, _ = _padded(chunk)
        advantages = torch.tensor([s.advantage for s in chunk], dtype=torch.float32)
        new = token_logprobs(model, ids, attention, wanted=mask)
        loss, n_clipped = grpo_loss(new, old, advantages, mask, clip, float(total))
        loss.backward()
        with torch.no_grad():
            loss_sum += float(loss)
            clipped += float(n_clipped)
            gap += float(((new - old).abs() * mask).sum())
            ratio_sum += float((torch.exp(new - old) * mask).sum())
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
    optimizer.step()
    n = max(total, 1)
    return StepFigures(loss_sum, clipped / n, gap / n, ratio_sum / n, total, grad_norm, time.monotonic() - started)


@torch.no_grad()
def sequence_logprobs(model: Any, prompt_ids: list[int], response_ids: list[int]) -> list[float]:
    """The policy's logprob of each response token after the prompt (the probe fingerprint)."""
    ids = torch.tensor([prompt_ids + response_ids])
    wanted = torch.zeros_like(ids)
    wanted[0, len(prompt_ids) :] = 1
    out = token_logprobs(model, ids, torch.ones_like(ids), wanted)
    return out[0, len(prompt_ids) :].tolist()


def save_weights(model: Any, out: Path, lora: bool) -> float:
    """Write what the server loads: the full model (safetensors, float32) or the LoRA adapter
    (the tokenizer is not needed: the server keeps its own). Returns seconds spent."""
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    return time.monotonic() - started
