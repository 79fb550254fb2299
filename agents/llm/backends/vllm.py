"""vLLM's token-in/token-out subset of `/v1/completions`: prompt ids in, sampled ids out.

`return_token_ids` makes vLLM send back the exact ids it sampled; `logprobs: 0` adds the
logprob of each sampled token (and no alternatives, which would only cost bandwidth). With
`stop` strings vLLM cuts its `text` before the match but keeps every sampled id (the tokens
that spelled the stop string included) and names the match in `stop_reason`.
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
    finite_logprobs,
    register_backend,
)


@register_backend
class VLLMBackend(LLMBackend):
    """vLLM (or anything speaking its completions subset, like the LLM simulator)."""

    class Config(BackendConfig):
        """Chooses this backend."""

        type: Literal["vllm"] = Field("vllm", description="The backend's registered name")

    streams = True

    def generate(self, url: str, request: GenerateRequest) -> Generation:
        """POST /v1/completions with token ids; read `token_ids` and `logprobs.token_logprobs`."""
        body = {
            "model": request.model,
            "prompt": request.prompt_ids,
            "max_tokens": request.max_tokens,
            **request.sampling_params("temperature", "top_p", "top_k"),
            "logprobs": 0,
            "return_token_ids": True,
            **request.stop_and_seed(),
        }
        started = time.monotonic()
        if request.on_delta is not None:
            return self._streamed(url, {**body, "stream": True}, request, started)
        data = self._call("POST", f"{url}/v1/completions", body, request.timeout, request.headers)
        try:
            choice = data["choices"][0]
            token_ids = [int(t) for t in choice["token_ids"]]
            logprobs = finite_logprobs(choice["logprobs"]["token_logprobs"])
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ServerError(f"{url}: no token_ids/logprobs in the answer ({exc!r})") from exc
        return Generation(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=choice.get("finish_reason"),
            stop_reason=choice.get("stop_reason"),
            server=url,
            latency=time.monotonic() - started,
        )

    def _streamed(self, url: str, body: dict, request: GenerateRequest, started: float) -> Generation:
        """The same call with `stream: true`: each chunk's `text` goes to `on_delta` as it
        arrives; the ids and logprobs are the chunks' own (`token_ids` and
        `logprobs.token_logprobs` of each chunk are that chunk's new tokens, as vLLM streams
        them with `return_token_ids`), so the Generation equals the non-streamed one."""
        token_ids: list[int] = []
        logprobs: list[float] = []
        finish = stop_reason = None
        assert request.on_delta is not None
        for event in self._stream(f"{url}/v1/completions", body, request.timeout, request.headers, request.on_open):
            try:
                choice = event["choices"][0] if event.get("choices") else None
                if choice is None:
                    continue  # a usage chunk
                token_ids += [int(t) for t in choice.get("token_ids") or []]
                if choice.get("logprobs") is not None:
                    logprobs += finite_logprobs(choice["logprobs"]["token_logprobs"])
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise ServerError(f"{url}: no token_ids/logprobs in a streamed chunk ({exc!r})") from exc
            finish = choice.get("finish_reason") or finish
            stop_reason = choice.get("stop_reason", stop_reason)
            if choice.get("text"):
                request.on_delta(choice["text"])
        if len(logprobs) != len(token_ids):
            raise ServerError(f"{url}: {len(token_ids)} streamed token ids but {len(logprobs)} logprobs")
        return Generation(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish,
            stop_reason=stop_reason,
            server=url,
            latency=time.monotonic() - started,
        )
