"""The wire of pool-wide pauses and verified weight pushes, typed once: the gateway parses
requests and answers with these models, the SDK checks a probe with them before sending.

`POST /v1/llm/pause` (PoolPause -> PoolPaused), `POST /v1/llm/resume` (PoolResume ->
PoolResumed), `POST /v1/weights/push` (WeightPush -> WeightPushReport; a push that fails its
verification answers 409 `weight_push_failed` with a WeightPushReport as `details`).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Mechanism = Literal["reload", "lora"]
ServerIds = list[str] | None


class _Strict(BaseModel):
    """Request models: an unknown field is an error naming it."""

    model_config = ConfigDict(extra="forbid")


class Probe(_Strict):
    """The trainer's fingerprint of its new weights: greedy continuation of `prompt_ids`.

    `token_ids` are the argmax tokens the trainer's model generates after the prompt (stopping
    after an end token if it comes first), `logprobs` their log-probabilities in fp32
    (`raas_client.weights.probe_fingerprint`). The prompt should be longer than the server's KV
    block (vLLM on CPU: 128 tokens) so that a stale prefix cache holds a block of it.
    """

    prompt_ids: list[int] = Field(min_length=1, max_length=16_384, description="Probe prompt")
    token_ids: list[int] = Field(min_length=1, max_length=1024, description="The trainer's greedy continuation")
    logprobs: list[float] = Field(
        min_length=1, max_length=1024, description="log p of each of token_ids under the new weights"
    )

    @model_validator(mode="after")
    def _aligned(self) -> Probe:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"probe.logprobs: one logprob per token id is needed ({len(self.logprobs)} for {len(self.token_ids)})"
            )
        if not all(math.isfinite(x) for x in self.logprobs):
            raise ValueError("probe.logprobs: every logprob must be finite")
        return self


class WeightPush(_Strict):
    """POST /v1/weights/push: pause, load, verify against the trainer's probe, record, resume."""

    version: str = Field(min_length=1, max_length=128, description="The new weight version")
    mechanism: Mechanism = Field(
        "reload", description="reload: full in-place reload of a checkpoint folder; lora: an adapter under `lora_name`"
    )
    path: str = Field(
        min_length=1,
        max_length=4096,
        description="A folder the inference servers read (raas reads only its config.json, for the tie check)",
    )
    lora_name: str | None = Field(
        None, min_length=1, max_length=256, description="The fixed adapter name (mechanism lora)"
    )
    probe: Probe = Field(description="The trainer's fingerprint of the new weights")
    tolerance: float = Field(1e-3, gt=0, le=10, description="Largest |Δ logprob| per token")
    servers: ServerIds = Field(None, description="Server ids; default: the whole pool")
    timeout: float = Field(300.0, gt=0, le=3600, description="Pause wait limit (seconds)")

    @model_validator(mode="after")
    def _lora_named(self) -> WeightPush:
        if self.mechanism == "lora" and not self.lora_name:
            raise ValueError("lora_name: required for mechanism lora")
        return self


class ProbeCheck(BaseModel):
    """What a server served for the probe, against the fingerprint."""

    ok: bool
    max_abs_diff: float | None = Field(
        None, description="Largest |served - trainer| logprob over the tokens both agree on"
    )
    first_mismatch: int | None = Field(None, description="Index of the first differing token")
    served_ids: list[int] = Field(default_factory=list)
    served_logprobs: list[float] = Field(default_factory=list)


class ServerPushReport(BaseModel):
    """One server's push: timings, the verification, and why it failed if it did."""

    id: str
    url: str
    ok: bool = False
    error: str | None = None
    generating_at_pause: int = Field(0, description="Generations in flight when it paused")
    pause_seconds: float = Field(0.0, description="Until its in-flight generations ended")
    load_seconds: float | None = None
    verify_seconds: float | None = None
    total_seconds: float = 0.0
    before_max_abs_diff: float | None = Field(
        None, description="The probe on the old weights (before loading) vs the fingerprint"
    )
    check: ProbeCheck | None = None


class WeightPushReport(BaseModel):
    """The answer to a weight push (also the `details` of its 409 when it failed)."""

    version: str
    mechanism: Mechanism
    resumed: bool = Field(description="False: verification failed and the pool stays paused")
    pause_seconds: float = Field(description="Pause until no generation was in flight")
    total_seconds: float
    servers: list[ServerPushReport]


class PoolPause(_Strict):
    """POST /v1/llm/pause: stop new generations and wait for the ones in flight."""

    servers: ServerIds = Field(None, description="Server ids; default: every server of the caller's pool")
    timeout: float = Field(
        300.0,
        gt=0,
        le=3600,
        description="Seconds to wait for in-flight generations; past it 409 pause_timeout, the servers stay paused",
    )


class PausedServerView(BaseModel):
    """One paused server: how many generations were in flight, how long they took to end."""

    id: str
    url: str
    generating_at_pause: int
    paused_seconds: float


class PoolPaused(BaseModel):
    """The pool is paused and no generation is in flight on it."""

    pause_seconds: float = Field(description="From the call until the last server drained")
    servers: list[PausedServerView]


class PoolResume(_Strict):
    """POST /v1/llm/resume: serve again, recording `weight_version` from the next turn on."""

    servers: ServerIds = Field(None, description="Server ids; default: the whole pool")
    weight_version: str | None = Field(
        None, min_length=1, max_length=128, description="The version every later turn records"
    )


class ResumedServer(BaseModel):
    """A resumed server as it is now."""

    id: str
    url: str
    model: str | None = None
    weight_version: str | None = None
    paused: bool


class PoolResumed(BaseModel):
    """The resumed servers."""

    servers: list[ResumedServer]
