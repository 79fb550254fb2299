"""Fixtures of the endpoint tests: a real LLM session on the simulator behind a real endpoint.

`endpoint(script, ...)` serves the LLM simulator (the named fake of vLLM's token-id API; it
encodes its scripted replies with the real SmolLM2 tokenizer) in a thread, opens a real
`LLMSession` on it with the Qwen-style tool template (or SmolLM2's own ChatML), builds the
RUN context (turns land in `recorded(ep)`) and enters a `RolloutEndpoint` on a
Unix socket. `openai_client(ep)` / `anthropic_client(ep)` are the official SDK clients talking
real HTTP over that socket.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.abstract import HandlerConfig
from agents.harness import RolloutEndpoint
from agents.job_config import JobConfig
from bench.support.run_context import run_context

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SMOLLM2 = str(FIXTURES / "smollm2-tokenizer")
QWEN_TEMPLATE = (FIXTURES / "qwen-style-template" / "chat_template.jinja").read_text()
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
}


class TurnLog:
    """A `record_turn` that keeps the turns in a list (no database)."""

    def __init__(self) -> None:
        self.turns: list[dict[str, Any]] = []

    def __call__(self, **turn: Any) -> None:
        self.turns.append(turn)


def make_ctx(
    llm: Any,
    limits: dict[str, Any] | None = None,
    timeout: float = 60.0,
    cancel_check: Callable[[], bool] = lambda: False,
    record_turn: Callable[..., None] | None = None,
    attempt: int = 1,
    workspace: str | None = None,
    resume_turns: list[dict[str, Any]] | None = None,
) -> Any:
    """The RUN context the pipeline would hand the harness handler (turns: `recorded`;
    `resume_turns`: an earlier attempt's logged calls, as a new attempt's RUN gets them)."""
    return run_context(
        rollout_id="rollout-h",
        job_id="job-h",
        instance_id="i-1",
        instance={"instance_id": "i-1"},
        sample_index=0,
        attempt=attempt,
        workspace=workspace,
        resume_turns=resume_turns,
        agent_config=HandlerConfig(),
        job_config=JobConfig(limits=limits or {}),
        deadline=time.monotonic() + timeout,
        state={},
        llm=llm,
        record_turn=record_turn or TurnLog(),
        cancel_check=cancel_check,
    )


def recorded(ep: RolloutEndpoint) -> list[dict[str, Any]]:
    """The turns the endpoint recorded."""
    return ep.ctx.record_turn.turns


def socket_dir() -> str:
    """A short private folder (Unix socket paths are limited to ~107 bytes)."""
    return tempfile.mkdtemp(prefix="raas-ep-", dir="/tmp")


@pytest.fixture
def endpoint() -> Iterator[Callable[..., RolloutEndpoint]]:
    """Factory: (script, max_model_len=4096, template=qwen, limits=None, **sim) -> an entered
    endpoint on a fresh simulator; everything is closed after the test."""
    from agents.llm import LLMSession
    from fakellm.server import start_simulator

    cleanups: list[Callable[[], None]] = []

    def make(
        script: dict[str, Any],
        max_model_len: int = 4096,
        template: str | None = "qwen",
        limits: dict[str, Any] | None = None,
        sampling: dict[str, Any] | None = None,
        server_max: int | None = None,
        **ctx_kwargs: Any,
    ) -> RolloutEndpoint:
        url, stop = start_simulator(SMOLLM2, script, max_model_len=server_max)
        cleanups.append(stop)
        spec: dict[str, Any] = {
            "servers": [{"url": url, "model": "sim", "weight_version": "v7"}],
            "tokenizer": SMOLLM2,
            "max_model_len": max_model_len,
        }
        if template is not None:  # None: SmolLM2's own ChatML; else "qwen" or a template's text
            spec["chat_template_text"] = QWEN_TEMPLATE if template == "qwen" else template
        session = LLMSession.open(spec, sampling or {"max_tokens": 256}, "rollout-h")
        cleanups.append(session.close)
        ctx = make_ctx(session, limits, **ctx_kwargs)
        ep = RolloutEndpoint(ctx, f"{socket_dir()}/model.sock", RolloutEndpoint.new_token())
        ep.__enter__()
        cleanups.append(lambda: ep.__exit__(None, None, None))
        return ep

    yield make
    for cleanup in reversed(cleanups):
        cleanup()


def uds_client(ep: RolloutEndpoint, http: Any = httpx) -> Any:
    """An httpx client whose connections go to the endpoint's Unix socket (`http`: the
    httpx module an SDK uses; recent anthropic SDKs use its `httpx2` fork)."""
    return http.Client(transport=http.HTTPTransport(uds=ep.socket_path), timeout=30)


def _sdk_http(sdk: Any) -> Any:
    """The httpx module the SDK's own client is built on."""
    import importlib

    base = importlib.import_module(f"{sdk.__name__}._base_client")
    return getattr(base, "httpx2", None) or base.httpx


def openai_client(ep: RolloutEndpoint, token: str | None = None, max_retries: int = 0) -> Any:
    """The official OpenAI SDK client, over the endpoint's socket."""
    import openai

    return openai.OpenAI(
        base_url="http://rollout/v1",
        api_key=token or ep.token,
        http_client=uds_client(ep, _sdk_http(openai)),
        max_retries=max_retries,
    )


def anthropic_client(ep: RolloutEndpoint, token: str | None = None, max_retries: int = 0) -> Any:
    """The official Anthropic SDK client, over the endpoint's socket."""
    import anthropic

    return anthropic.Anthropic(
        base_url="http://rollout",
        api_key=token or ep.token,
        http_client=uds_client(ep, _sdk_http(anthropic)),
        max_retries=max_retries,
    )


def ids_of(text: str) -> list[int]:
    """SmolLM2's ids of `text` (what the simulator sends for a scripted reply)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(f"{SMOLLM2}/tokenizer.json").encode(text, add_special_tokens=False).ids


@contextlib.contextmanager
def loopback_relay(socket_path: str) -> Iterator[int]:
    """The sandbox's loopback relay (`sandbox/toolserver/relay.py`) in a thread, for harnesses
    that speak HTTP over TCP only (Codex, the Gemini CLI). Yields its port on 127.0.0.1."""
    from sandbox.toolserver.relay import serve

    listener = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        with contextlib.suppress(OSError):  # the listener closed: the test is over
            serve(listener, socket_path)

    threading.Thread(target=run, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def npm_install(root: Path, package: str, command: str) -> Path:
    """`npm install` a harness from the npm registry into `root`; the path of its command."""
    npm = ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(root), package]
    subprocess.run(npm, check=True, capture_output=True, timeout=600)
    return root / "node_modules" / ".bin" / command
