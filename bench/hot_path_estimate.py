"""The steady rate of `bench/hot_path.py`: rollouts per second from the sorted finish offsets.

Every slot starts at once and every rollout holds its slot about as long, so the finishes come
in waves of `slots`. A window cut at fixed shares of the finishes (the old estimator: first and
last sixth dropped) spans a fraction of a wave at each end: with 640 rollouts through 64 slots
it counts 428 finishes across about 7 wave periods, so a service with no overhead measures
428 / 448 = 0.955 of the bound, and the figure moves by several per cent with where the cut
lands in a wave. Windows that span whole waves count every slot once per period whatever the
phase. Imported by the bench from its own folder, like `hot_path_profile`.
"""

from __future__ import annotations

import statistics


def steady_rate_trimmed(done: list[float]) -> float:
    """Rollouts per second between the first and last sixth of the sorted finish offsets `done`
    (the estimator of BENCHMARKS.md's figures before the whole-wave one; biased, see above)."""
    n = len(done)
    lo, hi = max(1, n // 6), n - n // 6  # max(1, ...): below 6 rollouts done[lo - 1] must not wrap
    return (hi - lo) / (done[hi - 1] - done[lo - 1])


def steady_rate(done: list[float], slots: int) -> float:
    """Rollouts per second from the sorted finish offsets `done`, over windows of whole waves.

    After the first sixth, each phase `lo` of one wave period gives the window [lo, lo + k x slots)
    of the most whole waves (k) that fit between the first and last sixth; a window may reach into
    the last sixth by up to a wave at the later phases, never past the data. The median over the
    phases damps a straggler at one cut. Fewer finishes than one wave past the trims cannot give
    a whole-wave window, so that falls back to `steady_rate_trimmed` (a partial wave, biased).
    """
    n = len(done)
    trim = max(1, n // 6)
    k = (n - 2 * trim) // slots
    if k < 1:
        return steady_rate_trimmed(done)
    span = k * slots
    phases = range(trim, min(trim + slots, n - span + 1))  # never empty: trim + span <= n - trim
    return statistics.median(span / (done[lo + span - 1] - done[lo - 1]) for lo in phases)
