"""The steady-rate estimators of `bench/hot_path.py` on synthetic finish times: whole-wave
windows read a zero-overhead service as the latency bound whatever the phase; the old cut
(first and last sixth dropped) reads it low and moves with where the cut lands in a wave."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))  # bench/ is scripts, not a package

from hot_path_estimate import steady_rate, steady_rate_trimmed  # noqa: E402

SLOTS, PERIOD = 64, 4.1  # the bench's 64 slots, a rollout's 4 turns of 1.0 s plus overhead
BOUND = SLOTS / PERIOD


def waves(count: int, jitter: float = 0.05, skip: int = 0, n: int = 640) -> list[float]:
    """Finish offsets of `count` synchronized waves of SLOTS (every slot frees once a PERIOD, a
    wave's finishes spread evenly over `jitter` s), from the `skip`-th finish on, `n` of them."""
    done = sorted((w + 1) * PERIOD + jitter * i / SLOTS for w in range(count) for i in range(SLOTS))
    return done[skip : skip + n]


def test_whole_waves_read_the_bound_the_old_cut_reads_low() -> None:
    done = waves(10)
    assert steady_rate(done, SLOTS) == pytest.approx(BOUND, rel=0.01)
    # 428 finishes over ~7 periods: 428 / 448 of the bound, with no overhead at all
    assert steady_rate_trimmed(done) < 0.96 * BOUND


def test_the_phase_of_the_waves_hardly_moves_the_whole_wave_rate() -> None:
    """The measured job starting part-way into a wave (11 waves, the first `skip` finishes cut)."""
    new = [steady_rate(waves(11, skip=skip), SLOTS) / BOUND for skip in range(0, SLOTS, 4)]
    old = [steady_rate_trimmed(waves(11, skip=skip)) / BOUND for skip in range(0, SLOTS, 4)]
    assert max(new) - min(new) < 0.005
    assert max(old) - min(old) > 0.05  # from below 0.96 to above 1.05 of the bound


@pytest.mark.parametrize("irregular", [False, True])
def test_without_waves_both_estimators_agree(irregular: bool) -> None:
    """Finishes at a steady rate (evenly spaced, or with deterministic uneven gaps of the same
    mean): no waves to cut through, so the old figures stay comparable."""
    rate = 15.0
    gaps = [(0.5 + (i * 0.6180339887) % 1.0 if irregular else 1.0) / rate for i in range(640)]
    done = [sum(gaps[: i + 1]) for i in range(640)]
    assert steady_rate(done, SLOTS) == pytest.approx(steady_rate_trimmed(done), rel=0.02)
    assert steady_rate(done, SLOTS) == pytest.approx(rate, rel=0.02)


def test_too_few_finishes_for_a_whole_wave_fall_back_to_the_old_cut() -> None:
    done = waves(1, jitter=1.0, n=50)  # 50 - 2 x 8 finishes past the trims: under one wave of 64
    assert steady_rate(done, SLOTS) == steady_rate_trimmed(done)


def test_quick_run_sizes_fit_two_waves() -> None:
    """`--quick`'s 192 rollouts: 128 past the trims, two whole waves at every phase that fits."""
    assert steady_rate(waves(3, n=192), SLOTS) == pytest.approx(BOUND, rel=0.01)
