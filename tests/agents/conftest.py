"""Fixtures shared by the handler tests: a real LLM session on the simulator, a StageContext.

`make_llm(script)` serves the LLM simulator (a scripted fake of vLLM's token-id API, encoding
replies with the real SmolLM2 tokenizer) in a thread and opens a real `LLMSession` on it.
`make_ctx(...)` builds the `StageContext` the pipeline would hand a handler, with `record_turn`
collecting turns into `ctx.turns_recorded` (a list) instead of the database.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.base import HandlerConfig, StageContext

TOKENIZER_DIR = str(Path(__file__).resolve().parents[1] / "fixtures" / "smollm2-tokenizer")


@pytest.fixture(scope="session")
def llm_db_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A migrated SQLite database for the LLM server pool's bookkeeping (one per session)."""
    from migrations.runner import upgrade

    url = f"sqlite:///{tmp_path_factory.mktemp('llm-db') / 'raas.db'}"
    upgrade(url)
    return url


@pytest.fixture
def make_llm(llm_db_url: str) -> Iterator[Callable[..., Any]]:
    """Factory: (script dict, max_model_len=4096) -> an open LLMSession on a fresh simulator."""
    from agents.llm import LLMSession
    from agents.llm.simulator import start_simulator

    cleanups: list[Callable[[], None]] = []

    def make(script: dict[str, Any], max_model_len: int = 4096,
             sampling: dict[str, Any] | None = None) -> LLMSession:
        url, stop = start_simulator(TOKENIZER_DIR, script)
        cleanups.append(stop)
        spec = {"servers": [{"url": url, "model": "sim"}], "tokenizer": TOKENIZER_DIR,
                "max_model_len": max_model_len}
        session = LLMSession.open(spec, sampling or {"max_tokens": 512}, "rollout-test",
                                  llm_db_url)
        cleanups.append(session.close)
        return session

    yield make
    for cleanup in reversed(cleanups):
        cleanup()


@pytest.fixture
def make_ctx() -> Callable[..., StageContext]:
    """Factory for a StageContext; turns passed to `record_turn` land in `ctx.turns_recorded`."""

    def make(*, stage: str = "run", instance: dict[str, Any] | None = None,
             agent_config: HandlerConfig | None = None, limits: dict[str, Any] | None = None,
             timeout: float = 60.0, sandbox: Any = None, llm: Any = None,
             workspace: str | None = None, state: dict[str, Any] | None = None,
             cancel_check: Callable[[], bool] = lambda: False) -> StageContext:
        turns: list[dict[str, Any]] = []
        instance = instance or {"instance_id": "test-instance"}
        ctx = StageContext(
            rollout_id="rollout-test", job_id="job-test", stage=stage,
            instance_id=str(instance.get("instance_id", "test-instance")), instance=instance,
            sample_index=0, attempt=1, agent_config=agent_config or HandlerConfig(),
            job_config={"limits": limits or {}}, deadline=time.monotonic() + timeout,
            state=state if state is not None else {}, sandbox=sandbox, llm=llm,
            workspace=workspace, record_turn=lambda **turn: turns.append(turn),
            cancel_check=cancel_check,
        )
        ctx.turns_recorded = turns  # type: ignore[attr-defined]
        return ctx

    return make
