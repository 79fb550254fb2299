"""The trainer's torch side (examples/train/policy.py) on a tiny random Llama: the loss equals
the numpy reference, logprobs are the model's, a step moves the policy, LoRA trains only the
adapter, and a tied model is refused. torch lives only in the trainer's venv:

    make test-train        # .venv-train, marker `train`
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "train"))

pytestmark = pytest.mark.train


@pytest.fixture(scope="module")
def torch():
    import torch

    torch.manual_seed(0)
    return torch


@pytest.fixture(scope="module")
def tiny_model_dir(torch, tmp_path_factory) -> Path:
    """A 2-layer Llama with its own lm_head, saved like the untied SmolLM2 copy."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    out = tmp_path_factory.mktemp("tiny")
    LlamaForCausalLM(config).save_pretrained(str(out))
    return out


def samples_for(model, torch, advantages=(1.0, -1.0)):
    """Two samples whose stored logprobs are the model's own (a fresh on-policy batch)."""
    from grpo import Sample
    from policy import sequence_logprobs

    out = []
    for i, adv in enumerate(advantages):
        prompt, response = [1, 2, 3 + i], [5 + i, 6, 7, 8][: 3 + i]
        lp = sequence_logprobs(model, prompt, response)
        out.append(Sample(f"r{i}", "a", prompt, response, lp, [1] * len(response), 1.0, adv, ["v0"]))
    return out


def test_loss_matches_the_numpy_reference(torch) -> None:
    from grpo import clipped_surrogate
    from policy import grpo_loss

    rng = np.random.default_rng(0)
    old = rng.normal(-1.0, 0.3, size=(3, 5))
    new = old + rng.normal(0.0, 0.3, size=(3, 5))
    adv = np.array([1.5, -0.5, 0.7])
    mask = (rng.random((3, 5)) > 0.3).astype(np.float64)
    ref_loss, ref_clip = clipped_surrogate(new, old, adv, mask, clip=0.2)
    t = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
    loss, clipped = grpo_loss(t(new), t(old), t(adv), t(mask), 0.2, float(mask.sum()))
    assert float(loss) == pytest.approx(ref_loss, rel=1e-9)
    assert float(clipped) / mask.sum() == pytest.approx(ref_clip)


def test_logprobs_are_the_models(torch, tiny_model_dir) -> None:
    from policy import load_policy, sequence_logprobs

    model = load_policy(str(tiny_model_dir))
    ids = torch.tensor([[1, 2, 3, 4]])
    expected = torch.log_softmax(model(input_ids=ids).logits[0, 2], -1)[4]
    assert sequence_logprobs(model, [1, 2, 3], [4])[0] == pytest.approx(float(expected), abs=1e-6)


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_a_step_moves_the_policy_and_starts_on_policy(torch, tiny_model_dir, lora_rank) -> None:
    from policy import load_policy, sequence_logprobs, train_step

    model = load_policy(str(tiny_model_dir), lora_rank=lora_rank)
    trainable = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    if lora_rank:
        assert trainable and all("lora_" in n for n in trainable) and frozen
    samples = samples_for(model, torch)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    figures = train_step(model, opt, samples, micro_batch=1)
    # stored logprobs were the model's: ratio 1, nothing clipped, no gap
    assert figures.logprob_gap < 1e-5 and figures.clip_fraction == 0.0
    assert figures.ratio_mean == pytest.approx(1.0, abs=1e-5) and figures.tokens == 7
    moved = [n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p.detach(), trainable[n])]
    assert moved
    assert all(torch.equal(p.detach(), frozen[n]) for n, p in model.named_parameters() if not p.requires_grad)
    # the positive-advantage sample became likelier
    before, after = (
        samples[0].response_logprobs,
        sequence_logprobs(model, samples[0].prompt_ids, samples[0].response_ids),
    )
    assert sum(after) > sum(before)


def test_a_tied_model_is_refused(torch, tmp_path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from policy import load_policy

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="untie_checkpoint.py"):
        load_policy(str(tmp_path))
