"""The simulator's weights (a fake vLLM, named as such) and the push steps of
`agents.llm.weights` against it: load, prefix-cache reset, verification, and each defect.

The probe prompt is the bundled SmolLM2 tokenizer's encoding of a long text (several cache
blocks); the simulator's greedy answer is its scripted reply, whose ids the fingerprint uses.
"""

from __future__ import annotations

import httpx
import pytest
from raas_client.weight_models import Probe
from raas_client.weights import DEFAULT_PROBE_TEXT
from tokenizers import Tokenizer

from fakellm.weights import fingerprint, write_checkpoint
from agents.llm.weights import (
    Fingerprint,
    apply_weights,
    compare,
    reset_prefix_cache,
    serve_probe,
    verify,
)
from tests.llm.conftest import SMOLLM2

REPLY = "one, two, three"
SCRIPT = {"default": [REPLY]}


def probe_for(url: str, seed: str) -> Fingerprint:
    """The trainer's fingerprint of weights `seed` for the default probe prompt."""
    prompt = Tokenizer.from_file(f"{SMOLLM2}/tokenizer.json").encode(DEFAULT_PROBE_TEXT).ids
    ids, _ = serve_probe(url, "vllm", None, Fingerprint(prompt, [0], [0.0]))
    return Fingerprint(**fingerprint(seed, prompt, ids))


def stats(url: str) -> dict:
    return httpx.get(f"{url}/sim/stats").json()["weights"]


def test_a_reload_changes_the_logprobs_and_verifies(simulators, tmp_path) -> None:
    url, _ = simulators(SCRIPT)
    probe = probe_for(url, "v1")
    assert len(probe.prompt_ids) > 32  # several cache blocks
    before = verify(url, "vllm", None, probe, 1e-3)
    assert not before.ok and before.max_abs_diff > 1e-3  # never-loaded weights differ
    seconds = apply_weights(url, "vllm", "reload", str(write_checkpoint(tmp_path / "v1", "v1")))
    reset_prefix_cache(url, "vllm")
    after = verify(url, "vllm", None, probe, 1e-3)
    assert after.ok and after.max_abs_diff == 0.0 and seconds < 5
    assert stats(url)["body"] == stats(url)["head"] == "v1"


def test_a_stale_prefix_cache_fails_the_verification(simulators, tmp_path) -> None:
    url, _ = simulators(SCRIPT)
    apply_weights(url, "vllm", "reload", str(write_checkpoint(tmp_path / "v1", "v1")))
    probe = probe_for(url, "v2")
    assert verify(url, "vllm", None, probe, 1e-3).max_abs_diff > 0  # warms the cache on v1
    apply_weights(url, "vllm", "reload", str(write_checkpoint(tmp_path / "v2", "v2")))
    stale = verify(url, "vllm", None, probe, 1e-3)  # no reset: the cached blocks are v1's
    assert not stale.ok and stale.max_abs_diff > 1e-3
    reset_prefix_cache(url, "vllm")
    assert verify(url, "vllm", None, probe, 1e-3).ok


def test_a_reset_that_does_nothing_is_caught(simulators, tmp_path) -> None:
    url, _ = simulators({**SCRIPT, "weights": {"reset_noop": True}})
    apply_weights(url, "vllm", "reload", str(write_checkpoint(tmp_path / "v1", "v1")))
    probe = probe_for(url, "v2")
    verify(url, "vllm", None, probe, 1e-3)
    apply_weights(url, "vllm", "reload", str(write_checkpoint(tmp_path / "v2", "v2")))
    reset_prefix_cache(url, "vllm")
    assert not verify(url, "vllm", None, probe, 1e-3).ok


def test_a_tied_checkpoint_keeps_the_old_head_and_fails(simulators, tmp_path) -> None:
    url, _ = simulators(SCRIPT)
    apply_weights(url, "vllm", "reload", str(write_checkpoint(tmp_path / "v1", "v1")))
    apply_weights(url, "vllm", "reload", str(write_checkpoint(tmp_path / "v2", "v2", tied=True)))
    reset_prefix_cache(url, "vllm")
    assert stats(url)["body"] == "v2" and stats(url)["head"] == "v1"
    assert not verify(url, "vllm", None, probe_for(url, "v2"), 1e-3).ok


def test_lora_under_a_fixed_name_is_replaced_not_piled_up(simulators, tmp_path) -> None:
    url, _ = simulators(SCRIPT)
    for seed in ("a1", "a2", "a3"):
        apply_weights(url, "vllm", "lora", str(write_checkpoint(tmp_path / seed, seed)), lora_name="policy")
        reset_prefix_cache(url, "vllm")
        assert verify(url, "vllm", "policy", probe_for(url, seed), 1e-3).ok
    weights = stats(url)
    assert weights["adapters"] == ["policy"] and weights["lora_loads"] == 3
    assert weights["lora_unloads"] == 2
    assert not verify(url, "vllm", None, probe_for(url, "a3"), 1e-3).ok  # base model differs


def test_compare_reports_the_first_differing_token() -> None:
    probe = Fingerprint(prompt_ids=[1, 2], token_ids=[5, 6, 7], logprobs=[-0.1, -0.2, -0.3])
    assert compare(probe, [5, 6, 7], [-0.1, -0.2005, -0.3], 1e-3).ok
    check = compare(probe, [5, 9, 7], [-0.1, -0.2, -0.3], 1e-3)
    assert (check.ok, check.first_mismatch, check.max_abs_diff) == (False, 1, 0.0)
    assert compare(probe, [5, 6], [-0.1, -0.2], 1e-3).first_mismatch == 2
    with pytest.raises(ValueError, match="one logprob per token"):  # the wire model says so
        Probe(prompt_ids=[1], token_ids=[1, 2], logprobs=[0.0])
