"""SGLang's native `/generate`: `input_ids` in, `output_ids` and per-token logprobs out."""

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
class SGLangBackend(LLMBackend):
    """SGLang runtime servers."""

    class Config(BackendConfig):
        """Chooses this backend."""

        type: Literal["sglang"] = Field("sglang", description="The backend's registered name")

    def generate(self, url: str, request: GenerateRequest) -> Generation:
        """POST /generate with input_ids and return_logprob; read output ids and logprobs."""
        sampling = request.sampling
        params = {"max_new_tokens": request.max_tokens, **request.sampling_params("temperature", "top_p", "top_k")}
        if request.stop_strings():
            params["stop"] = request.stop_strings()
        if sampling.get("seed") is not None:
            params["sampling_seed"] = sampling["seed"]
        body = {"input_ids": request.prompt_ids, "sampling_params": params, "return_logprob": True}
        started = time.monotonic()
        data = self._call("POST", f"{url}/generate", body, request.timeout, request.headers)
        try:
            meta = data["meta_info"]
            entries = meta["output_token_logprobs"]
            token_ids = [int(entry[1]) for entry in entries]
            logprobs = finite_logprobs(entry[0] for entry in entries)
            finish = meta.get("finish_reason") or {}
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ServerError(f"{url}: no output_token_logprobs in the answer ({exc!r})") from exc
        return Generation(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish.get("type") if isinstance(finish, dict) else finish,
            stop_reason=finish.get("matched") if isinstance(finish, dict) else None,
            server=url,
            latency=time.monotonic() - started,
        )
