"""Host side of a harness rollout: the per-rollout model endpoint and its token-exact capture.

An unmodified agent harness (mini-swe-agent, an openai-SDK agent, ...) runs in the rollout's
sandbox and talks to a model over the OpenAI or Anthropic API. `RolloutEndpoint` serves that
API on a Unix socket for one rollout, sends every call through the rollout's `LLMSession`
(sticky server, weight version, pause, cancel, deadline, budget, context) and records each
call as a turn; `agents.harness.samples` turns the calls into prefix-consistent training
samples (merged while the harness extends its history, split when it rewrites it).
"""

from agents.counters import EndpointCounters
from agents.harness.endpoint import RolloutEndpoint

__all__ = ["EndpointCounters", "RolloutEndpoint"]
