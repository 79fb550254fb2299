"""The one polling helper of the test suite: wait for a condition, fail naming what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 30,
    what: str = "condition",
    interval: float = 0.1,
    context: Callable[[], str] | None = None,
) -> Any:
    """Poll `predicate` until it returns something truthy (returned); fail naming `what`,
    with the end of what `context()` tells then (e.g. the logs of the processes awaited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    told = f"\n{context()[-4000:]}" if context is not None else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}{told}")
