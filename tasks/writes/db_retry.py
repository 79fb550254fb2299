"""Stage database writes ride out a short database outage instead of failing the rollout.

A PostgreSQL restart drops every pooled connection: the next statement fails, SQLAlchemy
invalidates the pool, and the statement after reconnects. Without a retry that first failure
reaches the stage as a retryable error and the rollout starts over. Here the lifecycle writes a
stage makes (claim, record_turn, save, advance, finish, retry, resume, the cancel read) and the
LLM pool's bookkeeping are retried on connection errors with capped exponential backoff for up
to `budget` seconds, which the worker sets to its `lease_timeout` (`configure`): an outage
shorter than the lease then costs the in-flight rollouts nothing, and one longer than the lease
is what the reaper's lost-lease rules are for anyway. Outside a worker (gateway, reaper, tests)
the budget is 0 and nothing is retried.

Whichever layer raises the error counts: SQLAlchemy's wrapped exceptions and the driver's own
(`DRIVER_DISCONNECTS`), since the hot path's statements check connections out of the pool
themselves (`core.driver_statements`).

A write whose commit reached the server but whose reply was lost is retried too; each one is
fenced so a second try is harmless (`record_turn` finds its own row, `advance` sees its own
hand-off, `finish`/`retry`/`resume` find the lease gone and report False). The heartbeat is not
wrapped: its thread beats again next interval.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import sqlite3

import psycopg
from sqlalchemy.exc import DBAPIError, OperationalError

log = logging.getLogger(__name__)
# A driver's own error for a lost, refused or busy connection, should one reach a stage
# unwrapped (`core.driver_statements` wraps what it raises; issue 40 was one that did not).
DRIVER_DISCONNECTS: tuple[type[Exception], ...] = (psycopg.OperationalError, sqlite3.OperationalError)
DATABASE_ERRORS = (DBAPIError, *DRIVER_DISCONNECTS)
F = TypeVar("F", bound=Callable[..., Any])
FIRST_WAIT = 0.1
MAX_WAIT = 2.0
_budget = 0.0


def configure(budget: float) -> None:
    """Retry connection errors for up to `budget` seconds per call (0: never) in this process."""
    global _budget
    _budget = max(0.0, float(budget))


def is_disconnect(exc: BaseException) -> bool:
    """True for a lost or refused database connection (worth another try), not a bad query."""
    return isinstance(exc, (OperationalError, *DRIVER_DISCONNECTS)) or (
        isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)
    )


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`, retried on connection errors within the configured budget."""
    deadline = time.monotonic() + _budget
    wait, tries = FIRST_WAIT, 0
    while True:
        try:
            return fn(*args, **kwargs)
        except DATABASE_ERRORS as exc:
            tries += 1
            if not is_disconnect(exc) or time.monotonic() + wait > deadline:
                raise
            if tries == 1:
                log.warning(
                    "database unreachable in %s, retrying for up to %.0fs: %s",
                    getattr(fn, "__name__", fn),
                    _budget,
                    str(exc).splitlines()[0],
                )
            time.sleep(wait)
            wait = min(wait * 2, MAX_WAIT)


def retrying(fn: F) -> F:
    """Decorator form of `call`."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return call(fn, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


class Retrying:
    """Every method of `target` through `call` (the LLM pool of a RUN); attributes as is."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value
        return functools.partial(call, value)
