"""What a rollout counts of the policy's replies, under the one name each count has in the
rollout's `metrics`: the shared agent loop (`agents.loop`, whose episode is a
`RolloutCounters`) and the harness endpoint (`agents.harness`, whose `EndpointCounters` is one
with the model API's own counts added) say the same thing the same way, so the job's health
(`tasks/watch/health.py`), the dashboard and a trainer read one vocabulary whichever ran the rollout.

Rows stored before the names were one carry the harness's old names; `metric_count` reads a
count under its name or any of those (`OLD_NAMES`).
"""

from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass, field, fields
from typing import Any

# Names a count had in rows stored before this vocabulary (the harness's): read, never written.
OLD_NAMES: dict[str, tuple[str, ...]] = {
    "malformed_tool_calls": ("parse_failures", "tool_calls_failed"),
    "tool_calls": ("tool_calls_parsed",),
}


@dataclass
class RolloutCounters:
    """The counts every rollout's `metrics` carry, whoever drove the policy."""

    turns: int = 0  # model replies recorded as turns of the trajectory
    tool_calls: int = 0  # well-formed tool calls: run by the loop, returned to a harness
    malformed_tool_calls: int = 0  # tool-call blocks whose markup did not parse
    replies_without_tool_call: int = 0  # tools were offered and the reply called none

    def metrics(self) -> dict[str, Any]:
        """The shared counts under their metric names."""
        return {f.name: getattr(self, f.name) for f in fields(RolloutCounters)}


@dataclass
class EndpointCounters(RolloutCounters):
    """A harness rollout's counts: the shared ones, and what its model API saw (the endpoint
    counts while it serves; the handler, the endpoint's record and the metrics read these)."""

    calls: int = 0  # model calls answered (successfully or with an API error)
    failed_calls: int = 0  # answered with an API error (bad request, context, budget, ...)
    tool_choice_unmet: int = 0  # tool_choice demanded a call (required/named/any/tool), none made
    generated_tokens: int = 0  # every generation's tokens (what `limits.max_tokens` spends)
    samples: int = 0  # training samples the calls made (`agents.harness.samples`)
    merges: int = 0
    splits: int = 0
    split_reasons: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)  # API errors answered, by kind
    ignored_params: dict[str, int] = field(default_factory=dict)  # overridden by the job
    unenforced_params: dict[str, int] = field(default_factory=dict)  # accepted, not enforced
    refusals: dict[str, int] = field(default_factory=dict)  # requests refused, by the field named
    unauthorized: int = 0
    ttft_ms: list[float] = field(default_factory=list)  # each streamed call's time to first text
    stream_mismatches: int = 0  # streamed text the final reply did not start with (logged)
    redone_deltas: int = 0  # head-only template deltas the whole render redid (a request dropped each)

    @property
    def streamed_calls(self) -> int:
        """`stream: true` calls answered."""
        return len(self.ttft_ms)

    @property
    def ttft_ms_p50(self) -> float | None:
        """The streamed calls' median time to first token (request read -> first text)."""
        return round(statistics.median(self.ttft_ms), 3) if self.ttft_ms else None

    @property
    def ttft_ms_max(self) -> float | None:
        """The streamed calls' longest time to first token."""
        return max(self.ttft_ms) if self.ttft_ms else None

    def snapshot(self) -> EndpointCounters:
        """A copy that stays as it is (the runner's counters keep counting)."""
        return copy.deepcopy(self)

    def metrics(self) -> dict[str, Any]:
        """Every count under its metric name (the streamed calls' times as p50 and max)."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "ttft_ms"}
        return {
            **own,
            "streamed_calls": self.streamed_calls,
            "ttft_ms_p50": self.ttft_ms_p50,
            "ttft_ms_max": self.ttft_ms_max,
        }


def metric_count(metrics: dict[str, Any], name: str) -> int:
    """A count of a stored rollout's `metrics` by its name, or by a name it had before."""
    for key in (name, *OLD_NAMES.get(name, ())):
        if metrics.get(key) is not None:
            return int(metrics[key])
    return 0
