"""The simulator's `wrong_rate` (a fake model's stand-in for sampling): a share of replies
replaced by the wrong one, deterministic per prompt and occurrence, and served over HTTP."""

from __future__ import annotations

import httpx

from fakellm.script import Script
from fakellm.server import BUNDLED_TOKENIZER, start_simulator

SCRIPT = {"default": ["right"], "wrong": "wrong", "wrong_rate": 0.3, "seed": 11}


def draws(script: dict, prompts: list[list[int]]) -> list[bool]:
    sim = Script(str(BUNDLED_TOKENIZER), script)
    return [sim.wrong_draw(p) for p in prompts]


def test_wrong_rate_is_a_seeded_share_that_replays():
    prompts = [[1, 2, 3 + k % 5] for k in range(3000)]  # five prompts, 600 samples each
    first = draws(SCRIPT, prompts)
    assert draws(SCRIPT, prompts) == first  # a restarted simulator replays the draws
    assert 0.27 < sum(first) / len(first) < 0.33
    same_prompt = first[::5]  # samples of one prompt differ: a GRPO group gets variance
    assert 0.25 < sum(same_prompt) / len(same_prompt) < 0.35
    assert draws({**SCRIPT, "seed": 12}, prompts) != first  # another seed, other draws
    assert not any(draws({**SCRIPT, "wrong_rate": 0.0}, prompts[:100]))


def test_the_server_answers_wrong_as_drawn():
    prompts = [[1, 2, 3]] * 20
    expected = ["wrong" if w else "right" for w in draws(SCRIPT, prompts)]
    url, stop = start_simulator(str(BUNDLED_TOKENIZER), SCRIPT)
    try:
        got = [
            httpx.post(f"{url}/v1/completions", json={"prompt": p, "max_tokens": 8}, timeout=10).json()["choices"][0][
                "text"
            ]
            for p in prompts
        ]
    finally:
        stop()
    assert got == expected and set(got) == {"right", "wrong"}
