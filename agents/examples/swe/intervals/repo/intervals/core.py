"""Merging and measuring closed intervals given as (start, end) pairs."""


def _check(interval):
    start, end = interval
    if start > end:
        raise ValueError(f"interval {interval!r} ends before it starts")
    return start, end


def merge(intervals):
    """Return the union of `intervals` as a sorted list of disjoint (start, end) tuples."""
    merged = []
    for start, end in sorted(_check(i) for i in intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = end
        else:
            merged.append([start, end])
    return [tuple(pair) for pair in merged]


def total_length(intervals):
    """Total length covered by `intervals`, counting overlaps once."""
    return sum(end - start for start, end in merge(intervals))


def gaps(intervals):
    """The uncovered stretches between the merged intervals, in order."""
    merged = merge(intervals)
    return [(a_end, b_start) for (_, a_end), (b_start, _) in zip(merged, merged[1:])]
