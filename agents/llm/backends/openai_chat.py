"""Text-only OpenAI chat backend, for API models and evaluation runs: NOT token-exact.

The server applies its own template and returns text, so the ids here are this side's
re-tokenization of that text and the logprobs are missing. Trajectories built with it carry
`token_exact = False` and the session logs a warning when it opens: never RL-train on them.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import Field

from agents.llm.backends.abstract import (
    BackendConfig,
    GenerateRequest,
    Generation,
    LLMBackend,
    ServerError,
    register_backend,
)


@register_backend
class OpenAIChatBackend(LLMBackend):
    """`POST /v1/chat/completions` with messages; returns text only."""

    class Config(BackendConfig):
        """Chooses this backend."""

        type: Literal["openai-chat"] = Field("openai-chat", description="The backend's registered name")

    token_exact = False

    def generate(self, url: str, request: GenerateRequest) -> Generation:
        """Send the messages (and tools); the caller re-tokenizes the text (not exact)."""
        body: dict = {
            "model": request.model,
            "messages": request.messages,
            "max_tokens": request.max_tokens,
            **request.sampling_params("temperature", "top_p"),
            **request.stop_and_seed(),
        }
        started = time.monotonic()
        base = url if url.endswith("/v1") else f"{url}/v1"
        data = self._call("POST", f"{base}/chat/completions", body, request.timeout, request.headers)
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ServerError(f"{url}: no message in the chat answer ({exc!r})") from exc
        return Generation(
            token_ids=[],
            logprobs=None,
            finish_reason=choice.get("finish_reason"),
            text=text,
            server=url,
            latency=time.monotonic() - started,
        )
