"""The simulator's `wrong_rate` (a fake model's stand-in for sampling): a share of replies
replaced by the wrong one, deterministic per prompt and occurrence, over real HTTP."""
from __future__ import annotations

import httpx

from agents.llm.simulator import BUNDLED_TOKENIZER, start_simulator

SCRIPT = {"default": ["right"], "wrong": "wrong", "wrong_rate": 0.3, "seed": 11}


def answers(url: str, prompts: list[list[int]]) -> list[str]:
    return [httpx.post(f"{url}/v1/completions", json={"prompt": p, "max_tokens": 8},
                       timeout=10).json()["choices"][0]["text"] for p in prompts]


def test_wrong_rate_is_a_seeded_share_that_replays():
    prompts = [[1, 2, 3 + k % 5] for k in range(200)]  # five prompts, 40 samples each
    url, stop = start_simulator(str(BUNDLED_TOKENIZER), SCRIPT)
    try:
        first = answers(url, prompts)
    finally:
        stop()
    url, stop = start_simulator(str(BUNDLED_TOKENIZER), SCRIPT)  # a restart replays the draws
    try:
        assert answers(url, prompts) == first
    finally:
        stop()
    assert set(first) == {"right", "wrong"}
    assert 0.2 < first.count("wrong") / len(first) < 0.4
    # samples of one prompt differ (a GRPO group gets variance), not just prompts
    assert {first[k] for k in range(0, 200, 5)} == {"right", "wrong"}
    url, stop = start_simulator(str(BUNDLED_TOKENIZER), {**SCRIPT, "seed": 12})
    try:
        assert answers(url, prompts) != first  # another seed, other draws
    finally:
        stop()


def test_no_wrong_rate_never_answers_wrong():
    url, stop = start_simulator(str(BUNDLED_TOKENIZER), {**SCRIPT, "wrong_rate": 0.0})
    try:
        assert set(answers(url, [[1, 2, 3]] * 30)) == {"right"}
    finally:
        stop()
