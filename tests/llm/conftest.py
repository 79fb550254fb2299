"""Fixtures of the LLM layer tests: the real SmolLM2 tokenizer, both templates, simulators, a DB."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fakellm.server import start_simulator
from migrations.runner import upgrade

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SMOLLM2 = str(FIXTURES / "smollm2-tokenizer")
QWEN_TEMPLATE = str(FIXTURES / "qwen-style-template" / "chat_template.jinja")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]


@pytest.fixture
def tokenizer_dir() -> str:
    """Folder of the real SmolLM2 tokenizer (ChatML template)."""
    return SMOLLM2


@pytest.fixture
def db_url(sqlite_url: str) -> str:
    """A SQLite database with the schema built by the migrations."""
    upgrade(sqlite_url)
    return sqlite_url


@pytest.fixture
def simulators() -> Iterator[Callable[..., tuple[str, Callable[[], None]]]]:
    """Factory starting LLM simulators on free ports; all are stopped after the test."""
    stops: list[Callable[[], None]] = []

    def start(script: dict, **kwargs) -> tuple[str, Callable[[], None]]:
        url, stop = start_simulator(SMOLLM2, script, **kwargs)
        done = False

        def stop_once() -> None:
            nonlocal done
            if not done:
                done = True
                stop()

        stops.append(stop_once)
        return url, stop_once

    yield start
    for stop in stops:
        stop()


def deadline(seconds: float = 20.0) -> float:
    """A time.monotonic() deadline `seconds` from now."""
    return time.monotonic() + seconds


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Qwen3-style tokenizer folder built offline (see tests/llm/styles.py)."""
    from tests.llm.styles import build_qwen3_style

    return build_qwen3_style(tmp_path_factory.mktemp("qwen3-style"))


@pytest.fixture(scope="session")
def llama31_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Llama-3.1-style tokenizer folder built offline (see tests/llm/styles.py)."""
    from tests.llm.styles import build_llama31_style

    return build_llama31_style(tmp_path_factory.mktemp("llama31-style"))
