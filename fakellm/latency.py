"""Latency distributions for the LLM simulator (a fake): a long tail on CPU.

Real agent rollouts have a long tail (a few samples think or loop much longer than the rest):
that tail is what a straggler cut (`spare`, `group_timeout`) is for, and it cannot be measured
with the simulator's fixed `latency`. A script's `latency_dist` (or `raas llm-sim
--latency-dist JSON`) adds a random delay to every answer:

    {"kind": "lognormal", "median": 0.2, "sigma": 1.0, "cap": 10, "seed": 0}
    {"kind": "tail", "base": 0.1, "p": 0.1, "slow": 5.0, "seed": 0}

`lognormal`: median seconds and the log-space spread (sigma 1: one answer in ten takes ~3.6x
the median, one in a hundred ~10x), capped at `cap`; `tail`: `base` seconds, and with
probability `p` `slow` seconds instead (a bimodal straggler). Draws come from one seeded
generator per server, in request order.
"""

from __future__ import annotations

import random
import threading
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class LatencyDist(BaseModel):
    """A per-answer random delay (seconds) added to the script's fixed latency."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["lognormal", "tail"] = Field(description="Shape of the distribution")
    median: float = Field(0.2, ge=0, description="lognormal: median seconds")
    sigma: float = Field(1.0, ge=0, description="lognormal: spread in log space")
    cap: float = Field(60.0, gt=0, description="Longest delay, seconds")
    base: float = Field(0.1, ge=0, description="tail: the usual delay, seconds")
    p: float = Field(0.1, ge=0, le=1, description="tail: probability of a slow answer")
    slow: float = Field(5.0, ge=0, description="tail: a slow answer's delay, seconds")
    seed: int = Field(0, description="Seed of the server's generator")

    def sampler(self) -> LatencySampler:
        """A thread-safe generator of delays for one server."""
        return LatencySampler(self)


class LatencySampler:
    """Draws delays from a `LatencyDist` (one seeded generator, shared by the threads)."""

    def __init__(self, dist: LatencyDist) -> None:
        self.dist = dist
        self._rng = random.Random(dist.seed)
        self._lock = threading.Lock()

    def draw(self) -> float:
        """The next delay, seconds."""
        d = self.dist
        with self._lock:
            if d.kind == "lognormal":
                value = d.median * self._rng.lognormvariate(0.0, d.sigma) if d.median else 0.0
            else:
                value = d.slow if self._rng.random() < d.p else d.base
        return min(value, d.cap)
