"""The drift audit: where a token-exact trajectory differs from a full re-render, per turn.

Counting differing *positions* overstates drift: one extra split token shifts everything after
it, and a 300-token tail would count as 300 "drifted" tokens. So the two id sequences are
aligned first (difflib's longest-matching-blocks alignment, after stripping the common prefix
and suffix so long trajectories stay cheap) and only the tokens outside the aligned blocks
count. Each difference is attributed to the turn whose generated span (or the observation
delta after it) it starts in; turn -1 is the prompt.
"""

from __future__ import annotations

from bisect import bisect_right
from difflib import SequenceMatcher
from typing import Any


def align_drift(
    built: list[int], reference: list[int], prompt_len: int, turn_boundaries: list[list[int]]
) -> dict[str, Any]:
    """Report how `built` differs from `reference` after alignment (never edits either).

    Returns `retokenization_drift` (differing tokens after alignment, 0 = identical),
    `first_diff` (first divergent position in `built`, or None) and `drift_turns`: one entry
    per affected turn, `{"turn", "first_diff", "differing_tokens"}`.
    """
    head = _common_prefix(built, reference)
    tail = _common_prefix(built[head:][::-1], reference[head:][::-1])
    a, b = built[head : len(built) - tail], reference[head : len(reference) - tail]
    per_turn: dict[int, dict[str, int]] = {}
    starts = [prompt_len + start for start, _ in turn_boundaries]
    for op, i1, i2, j1, j2 in SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        position = head + i1
        turn = bisect_right(starts, position) - 1
        entry = per_turn.setdefault(turn, {"turn": turn, "first_diff": position, "differing_tokens": 0})
        entry["differing_tokens"] += max(i2 - i1, j2 - j1)
    turns = [per_turn[k] for k in sorted(per_turn)]
    return {
        "retokenization_drift": sum(t["differing_tokens"] for t in turns),
        "first_diff": turns[0]["first_diff"] if turns else None,
        "drift_turns": turns,
    }


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
