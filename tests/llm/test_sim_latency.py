"""The simulator's long-tail latency (a fake's option, for straggler benchmarks)."""

from __future__ import annotations

import statistics
import time

import click
import pytest

from fakellm.latency import LatencyDist
from fakellm.script import Script
from fakellm.server import BUNDLED_TOKENIZER
from fakellm.cli import parse_latency_dist


def test_lognormal_has_its_median_a_long_tail_and_a_cap() -> None:
    sampler = LatencyDist(kind="lognormal", median=0.2, sigma=1.0, cap=5, seed=3).sampler()
    draws = sorted(sampler.draw() for _ in range(4000))
    assert 0.17 < statistics.median(draws) < 0.23
    assert draws[int(0.99 * len(draws))] > 5 * statistics.median(draws)  # the tail
    assert max(draws) <= 5
    a = LatencyDist(kind="tail", p=0.25, base=0.1, slow=3, seed=7).sampler()
    b = LatencyDist(kind="tail", p=0.25, base=0.1, slow=3, seed=7).sampler()
    seq = [a.draw() for _ in range(2000)]
    assert seq[:50] == [b.draw() for _ in range(50)]
    assert set(seq) == {0.1, 3.0} and 0.2 < seq.count(3.0) / len(seq) < 0.3


def test_a_script_adds_the_tail_to_its_answers() -> None:
    script = Script(
        str(BUNDLED_TOKENIZER),
        {"default": ["ok"], "latency_dist": {"kind": "tail", "p": 1.0, "slow": 0.3, "base": 0.0}},
    )
    prompt = script.tok.encode("<|im_start|>assistant\n").ids
    started = time.monotonic()
    answer = script.complete(prompt, 16)
    assert answer["text"] == "ok" and time.monotonic() - started >= 0.3


def test_bad_latency_dist_option_names_itself() -> None:
    assert parse_latency_dist('{"kind": "tail", "p": 0.1}')["p"] == 0.1
    with pytest.raises(click.BadParameter) as err:
        parse_latency_dist('{"kind": "pareto"}')
    assert "kind" in str(err.value)
