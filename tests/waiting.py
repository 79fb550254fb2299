"""The one polling helper of the test suite: wait for a condition, fail naming what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(predicate: Callable[[], Any], timeout: float = 30, what: str = "condition", interval: float = 0.1) -> Any:
    """Poll `predicate` until it returns something truthy (returned); fail naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
