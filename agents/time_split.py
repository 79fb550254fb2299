"""Whose time a RUN spent, and so whose failure its deadline is.

A RUN's wall time splits into what the agent did and what it waited for:

- **generation**: the policy sampling its own tokens. A reply is the policy's time up to what
  the pool is expected to take for it, `EXPECTED_FIRST_TOKEN_SECONDS` plus its tokens at
  `EXPECTED_TOKENS_PER_SECOND`; beyond that the server was slow (waiting). A request the
  deadline cut counts the same way for the tokens it asked for (a policy rambling to the
  deadline spends its own time; a server that answered nothing for longer than the longest
  reply could take was stalled). Measured by the LLM session (`LLMSession.clock`).
- **tools** (the shared loop) or **harness** (a registered harness's own work, i.e. its wall
  time minus its model calls): the agent's own actions.
- **waiting**: on the infrastructure: no healthy server, queueing for one, failed and retried
  requests, a server slower than expected, a request held by a server the pool was pausing.
- **paused**: a weight push paused the pool. Not charged: the deadline moved on by it.

The rule at a deadline (the RUN's, or a harness's own `timeout`): the agent's share of the
charged time (`elapsed - paused`) is `(generation + tools|harness) / charged`. At
`AGENT_SHARE` (one half) or more the agent's own actions used the time: `agent_error`
(failure class `policy`, reward 0, in its group's statistics). Below it the time ran out
mostly on infrastructure: `timeout` (failure class `infra`, kept out of group statistics).
Why a majority: a policy cannot make the infrastructure wait, so it cannot buy its way below
one half by stalling (the stall attack: tool calls that sleep until the deadline are all
tools time), while a rollout that lost half its time to a stalled server or pool is not
clearly the policy's doing and must not train as its failure. The remainder (raas's own work
between turns: tokenizing, logging turns, starting the session) counts as neither, so it
lowers the agent's share: a slow worker never turns into the policy's fault.

Where nothing was measured the deadline stays `timeout` (infra): a handler that does not run
the shared loop (its own `run` meeting `ctx.checkpoint`) and a RUN the reaper ends past its
deadline plus grace (a hung worker or a stalled node).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.models import Outcome

# What the pool is expected to sustain for one sequence: a reply slower than this spent the
# excess waiting on the server. Conservative (a loaded GPU server decodes one sequence at
# 20+ tokens/s): a slower server only moves time from the policy to the infrastructure.
EXPECTED_FIRST_TOKEN_SECONDS = 2.0
EXPECTED_TOKENS_PER_SECOND = 20.0
# At a deadline: the agent's share of the charged time from which it is the policy's failure.
AGENT_SHARE = 0.5


def expected_generation_seconds(tokens: int) -> float:
    """The longest a reply of `tokens` tokens counts as the policy's own generation time."""
    return EXPECTED_FIRST_TOKEN_SECONDS + max(0, tokens) / EXPECTED_TOKENS_PER_SECOND


@dataclass
class SessionClock:
    """Seconds one LLM session spent, cumulative: generation, waiting, paused."""

    generation: float = 0.0
    waiting: float = 0.0
    paused: float = 0.0

    def copy(self) -> SessionClock:
        """A snapshot (the session's own keeps counting)."""
        return SessionClock(self.generation, self.waiting, self.paused)


@dataclass
class TimeSplit:
    """One RUN's time split: `agent_own` is tools (the loop) or the harness's own work."""

    elapsed: float
    generation: float
    agent_own: float
    waiting: float
    paused: float
    own_label: str = "tools"

    @property
    def charged(self) -> float:
        """Wall seconds counted against the deadline (a paused pool moved it on)."""
        return max(0.0, self.elapsed - self.paused)

    @property
    def agent_share(self) -> float:
        """The agent's own actions as a share of the charged time (0 when none was charged)."""
        if self.charged <= 0:
            return 0.0
        return min(1.0, (self.generation + self.agent_own) / self.charged)

    def deadline_outcome(self) -> str:
        """The outcome of a RUN whose deadline passed: the agent's (`agent_error`) or the
        infrastructure's (`timeout`); see the module docstring."""
        return Outcome.AGENT_ERROR.value if self.agent_share >= AGENT_SHARE else Outcome.TIMEOUT.value

    def to_metrics(self) -> dict[str, Any]:
        """The rollout's `metrics.time_split` (seconds, and the agent's share)."""
        return {
            "elapsed": round(self.elapsed, 3),
            "generation": round(self.generation, 3),
            self.own_label: round(self.agent_own, 3),
            "waiting": round(self.waiting, 3),
            "paused": round(self.paused, 3),
            "other": round(max(0.0, self.charged - self.generation - self.agent_own - self.waiting), 3),
            "agent_share": round(self.agent_share, 3),
        }
