"""The wire of pool-wide pauses and verified weight pushes (typed once, shared with the SDK).

The probe and the per-server report are defined next to the code that checks them
(`agents.llm.weights`) and re-exported here.
"""
from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from agents.llm.weights import Mechanism, Probe, ProbeCheck, ServerPushReport, WeightPushReport
from app.schemas import LLMServerView, Strict

__all__ = ["PoolPause", "PoolPaused", "PausedServerView", "PoolResume", "PoolResumed", "Probe",
           "ProbeCheck", "ServerPushReport", "WeightPush", "WeightPushReport"]

ServerIds = list[str] | None


class PoolPause(Strict):
    """POST /v1/llm/pause: stop new generations and wait for the ones in flight."""

    servers: ServerIds = Field(None, description="Server ids; default: every server of the "
                                                 "caller's pool")
    timeout: float = Field(300.0, gt=0, le=3600, description="Seconds to wait for in-flight "
                           "generations; past it 409 pause_timeout, the servers stay paused")


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


class PoolResume(Strict):
    """POST /v1/llm/resume: serve again, recording `weight_version` from the next turn on."""

    servers: ServerIds = Field(None, description="Server ids; default: the whole pool")
    weight_version: str | None = Field(None, min_length=1, max_length=128,
                                       description="The version every later turn records")


class PoolResumed(BaseModel):
    """The resumed servers as they are now."""

    servers: list[LLMServerView]


class WeightPush(Strict):
    """POST /v1/weights/push: load, verify against the trainer's probe, record, resume."""

    version: str = Field(min_length=1, max_length=128, description="The new weight version")
    mechanism: Mechanism = Field("reload", description="reload: full in-place reload of a "
                                 "checkpoint folder; lora: an adapter under `lora_name`")
    path: str = Field(min_length=1, max_length=4096,
                      description="A folder the inference servers read (not raas)")
    lora_name: str | None = Field(None, min_length=1, max_length=256,
                                  description="The fixed adapter name (mechanism lora)")
    probe: Probe = Field(description="The trainer's fingerprint of the new weights")
    tolerance: float = Field(1e-3, gt=0, le=10, description="Largest |Δ logprob| per token")
    servers: ServerIds = Field(None, description="Server ids; default: the whole pool")
    timeout: float = Field(300.0, gt=0, le=3600, description="Pause wait limit (seconds)")

    @model_validator(mode="after")
    def _lora_named(self) -> WeightPush:
        if self.mechanism == "lora" and not self.lora_name:
            raise ValueError("lora_name: required for mechanism lora")
        return self
