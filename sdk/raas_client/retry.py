"""How the SDK rides out a gateway restart: exponential backoff with a cap per wait and
jitter, for as long as a total budget of consecutive failures allows.

A trainer waiting for results should survive a gateway redeploy or a node reboot (minutes),
not only a blip: the default budget is ten minutes, set per client (`retry_total=`) or for a
whole process with `RAAS_RETRY_TOTAL` (seconds). Only failures that say "try again" are
retried: lost connections and 502/503/504. A 4xx is the caller's mistake and is raised at once.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

RETRY_STATUSES = frozenset({502, 503, 504})
# A long poll also retries a 500: a gateway worker killed by its server's timeout mid-poll
# (gunicorn's sync workers at 30 s) answers 500 though nothing is wrong with the request.
LONG_POLL_RETRY_STATUSES = RETRY_STATUSES | {500}
# Long polls wait less than gunicorn's default worker timeout (30 s), whatever the worker class.
LONG_POLL_SECONDS = 25.0
RETRY_TOTAL_ENV = "RAAS_RETRY_TOTAL"
DEFAULT_RETRY_TOTAL = 600.0


def retry_total_from_env() -> float:
    """`RAAS_RETRY_TOTAL` in seconds, else the ten-minute default; a bad value says so."""
    raw = os.environ.get(RETRY_TOTAL_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_RETRY_TOTAL
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{RETRY_TOTAL_ENV}={raw!r} is not a number of seconds") from None
    if value < 0:
        raise ValueError(f"{RETRY_TOTAL_ENV}={raw!r} must be >= 0 seconds")
    return value


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff settings: waits double from `first_wait` up to `max_wait` each (with jitter),
    until `total` seconds have passed since the first failure of a run of failures."""

    total: float = DEFAULT_RETRY_TOTAL
    first_wait: float = 0.25
    max_wait: float = 10.0

    def __post_init__(self) -> None:
        if self.total < 0 or self.first_wait <= 0 or self.max_wait < self.first_wait:
            raise ValueError(f"bad retry policy {self}: need total >= 0 and 0 < first_wait <= max_wait")

    def backoff(self) -> Backoff:
        """A fresh run of failures under this policy."""
        return Backoff(self)


class Backoff:
    """One run of consecutive failures: `wait()` sleeps before the next attempt and answers
    False once the budget is spent; `reset()` after a success starts a new run."""

    def __init__(
        self,
        policy: RetryPolicy,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.policy = policy
        self.clock = clock
        self.sleep = sleep
        self.started: float | None = None
        self.attempt = 0

    def reset(self) -> None:
        """The last attempt worked: the next failure starts with a short wait again."""
        self.started = None
        self.attempt = 0

    def next_delay(self) -> float | None:
        """Seconds to wait before the next attempt, or None once the total is spent."""
        now = self.clock()
        if self.started is None:
            self.started = now
        remaining = self.started + self.policy.total - now
        if remaining <= 0:
            return None
        cap = min(self.policy.max_wait, self.policy.first_wait * 2 ** min(self.attempt, 30))
        self.attempt += 1
        # jitter in [cap/2, cap]: gateways restarting under many trainers are not hit in step
        return min(remaining, cap * random.uniform(0.5, 1.0))

    def wait(self) -> bool:
        """Sleep before retrying; False (no sleep) when the budget is spent."""
        delay = self.next_delay()
        if delay is None:
            return False
        self.sleep(delay)
        return True

    @property
    def elapsed(self) -> float:
        """Seconds since the first failure of this run (0 when none)."""
        return 0.0 if self.started is None else self.clock() - self.started
