"""Token-in/token-out LLM layer: backends, server pool, trajectory builder, tool-call parsing.

The agent loop talks to the policy only through `LLMSession` (one per rollout); the gateway
validates a job's `llm` and `sampling` configs with `validate_llm_spec` / `SamplingParams`.
"""

from agents.llm.backends import Generation
from agents.llm.session import LLMSession
from agents.llm.spec import (
    LLMSpec,
    SamplingParams,
    ServerSpec,
    validate_llm_spec,
    validate_sampling,
)
from agents.llm.tool_calls import ToolCall, parse_tool_calls
from agents.llm.trajectory import Trajectory, TrajectoryError

__all__ = [
    "Generation",
    "LLMSession",
    "LLMSpec",
    "SamplingParams",
    "ServerSpec",
    "ToolCall",
    "Trajectory",
    "TrajectoryError",
    "parse_tool_calls",
    "validate_llm_spec",
    "validate_sampling",
]
