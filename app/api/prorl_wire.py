"""The ProRL wire: `/process` request bodies and `sampling_params` as ProRL clients send them.

ProRL passes `sampling_params` straight into OpenHands' `LLMConfig` (which forbids unknown
fields) after popping its agent-config keys. raas honours the keys that mean something for a
rollout here and accepts, without effect, the ones that configure OpenHands' own LLM plumbing
(they are listed in `IGNORED_KEYS` with the reason); any other key is an error listing both.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from core.errors import InvalidRequest

# Accepted for compatibility, without effect: raas owns these concerns itself.
IGNORED_KEYS: dict[str, str] = {
    "model": "the model is the registered server's",
    "api_key": "server credentials are registered with the server pool",
    "base_url": "servers come from /add_llm_server",
    "api_version": "OpenHands/litellm plumbing",
    "custom_llm_provider": "litellm plumbing",
    "modify_params": "litellm plumbing",
    "drop_params": "litellm plumbing",
    "log_completions": "every turn is stored anyway",
    "log_completions_folder": "every turn is stored anyway",
    "native_tool_calling": "tools are always rendered by the chat template",
    "token_level_generation": "raas is always token-level (token-in/token-out)",
    "custom_tokenizer": "the tokenizer is the served model's",
    "ensure_thinking_end_properly": "token-level trajectories are never rewritten",
    "strict_loop_detector": "OpenHands agent option",
    "enable_vision": "no vision tools",
    "enable_a11y_tree": "no browser tools",
    "is_reasoning_task": "OpenHands agent option",
    "disable_vision": "no vision tools",
    "caching_prompt": "litellm plumbing",
    "num_retries": "the pool fails over between servers",
    "retry_multiplier": "the pool fails over between servers",
    "retry_min_wait": "the pool fails over between servers",
    "retry_max_wait": "the pool fails over between servers",
    "max_message_chars": "observations are clipped by the agent",
    "reasoning_effort": "API-model option",
    "input_cost_per_token": "cost accounting",
    "output_cost_per_token": "cost accounting",
}


class ProRLSampling(BaseModel):
    """The `sampling_params` keys raas honours (ProRL's names, plus vLLM's for convenience)."""

    model_config = ConfigDict(extra="allow")

    temperature: float | None = Field(None, ge=0, description="Sampling temperature")
    top_p: float | None = Field(None, gt=0, le=1, description="Nucleus mass")
    top_k: int | None = Field(None, ge=-1, description="Top-k (-1 = all)")
    seed: int | None = Field(None, description="Per-request seed")
    stop: list[str] | str | None = Field(None, description="Extra stop strings")
    max_output_tokens: int | None = Field(None, gt=0, description="Most tokens per turn")
    max_tokens: int | None = Field(None, gt=0, description="vLLM's name for max_output_tokens")
    max_new_tokens: int | None = Field(None, gt=0, description="Alias of max_output_tokens")
    max_iterations: int | None = Field(None, ge=1, le=10_000, description="Most agent turns")
    max_input_tokens: int | None = Field(None, gt=0, description="Most input tokens per call")
    max_model_len: int | None = Field(None, gt=0, description="Prompt + all turns, in tokens")
    enable_thinking: bool | None = Field(None, description="Chat-template enable_thinking")
    timeout: float | None = Field(None, gt=0, description="Seconds per generation call")

    def check_keys(self) -> None:
        """Reject keys that are neither honoured nor knowingly ignored, listing the valid ones."""
        unknown = sorted(set(self.model_extra or {}) - set(IGNORED_KEYS))
        if unknown:
            honoured = sorted(type(self).model_fields)
            raise InvalidRequest(
                f"sampling_params: unknown key(s) {', '.join(map(repr, unknown))}; accepted: "
                f"{', '.join(honoured)}; accepted without effect: {', '.join(sorted(IGNORED_KEYS))}",
                field="sampling_params",
                unknown=unknown,
            )

    def job_parts(self) -> dict[str, Any]:
        """`sampling`, `limits` and `llm` fields of the raas job these parameters describe."""
        self.check_keys()
        sampling: dict[str, Any] = {
            k: v
            for k, v in (
                ("temperature", self.temperature),
                ("top_p", self.top_p),
                ("top_k", self.top_k),
                ("seed", self.seed),
            )
            if v is not None
        }
        if self.stop is not None:
            sampling["stop"] = [self.stop] if isinstance(self.stop, str) else self.stop
        per_turn = self.max_output_tokens or self.max_tokens or self.max_new_tokens
        if per_turn is not None:
            sampling["max_tokens"] = per_turn
        limits = {"max_turns": self.max_iterations} if self.max_iterations else {}
        llm: dict[str, Any] = {}
        context = self._context_length(per_turn)
        if context is not None:
            llm["max_model_len"] = context
        if self.enable_thinking is not None:
            llm["chat_template_kwargs"] = {"enable_thinking": self.enable_thinking}
        if self.timeout is not None:
            llm["request_timeout"] = self.timeout
        return {"sampling": sampling, "limits": limits, "llm": llm}

    def _context_length(self, per_turn: int | None) -> int | None:
        """min(max_model_len, max_input_tokens + max_output_tokens): a call's input may not
        exceed max_input_tokens and it generates at most max_output_tokens."""
        bounds = [self.max_model_len] if self.max_model_len else []
        if self.max_input_tokens:
            bounds.append(self.max_input_tokens + (per_turn or 0))
        return min(bounds) if bounds else None


class ProcessRequest(BaseModel):
    """POST /process body, as ProRL defines it (plus raas's optional `agent_config`)."""

    model_config = ConfigDict(extra="forbid")

    instance: dict[str, Any] = Field(description="Dataset row; `data_source` picks the agent")
    sampling_params: dict[str, Any] = Field(description="ProRL sampling/LLM parameters")
    job_id: str | None = Field(None, description="Groups calls for /cancel (ProRL's job id)")
    agent_config: dict[str, Any] | None = Field(None, description="The agent's config (raas)")


class AddServer(BaseModel):
    """POST /add_llm_server body."""

    address: str = Field(min_length=1, description="host:port or URL of a vLLM/SGLang server")


class CancelRequest(BaseModel):
    """POST /cancel body."""

    job_id: str = Field(min_length=1, description="The job_id given to /process")
