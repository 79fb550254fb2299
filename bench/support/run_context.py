"""RUN's context outside a stage, for driving a handler or the harness endpoint directly."""

from __future__ import annotations

from typing import Any


def run_context(**fields: Any) -> Any:
    """RUN's context (`agents.contexts.RunContext`) with this process's settings."""
    from agents.contexts import RunContext
    from core.settings import load_settings

    return RunContext(settings=load_settings(), **fields)
