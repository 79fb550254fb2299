"""How a harness's RUN ended, as an outcome: whose failure it is, from what raas saw.

The harness is the agent, but not everything that stops it is the policy's doing. The
decision reads only the harness's exit (`launch.Ending`), the endpoint's counters
(`EndpointCounters`: calls answered, API errors by kind) and the RUN's time split:

- exit 0: `completed` / `finish` (graded), whatever the endpoint answered on the way;
- otherwise, in this order:
  - the endpoint refused it a request (4xx: an unsupported feature such as
    `tool_choice: "required"`, a malformed body, a wrong route or token): `infra_error` /
    `endpoint_refused` (infra, not graded), even if it then ran into its deadline (a harness
    retrying a refused request until its timeout is the same incompatibility);
  - not one model call was answered (it cannot start, crashed on import, hung before asking):
    `infra_error` / `harness_start` (infra, not graded: the policy never acted);
  - its deadline passed (the registration's `timeout` or RUN's), or it exited non-zero after
    the endpoint answered `deadline_exceeded`: `deadline`, and the outcome by the RUN's time
    split (`agents.time_split`): `agent_error` (policy, reward 0) when the harness's own work
    and its generation were the majority of the charged time, else `timeout` (infra);
  - else (its own crash, or one the model's actions caused): `agent_error` / `harness_exit`
    (policy; graded: no answer is 0).

A refusal or a start failure is a harness/endpoint incompatibility or a setup fault: the same
on every sample and every retry, nothing the policy chose, so it never trains as reward 0 and
is not retried. An error the policy owns (its context or token budget spent) is not a refusal.
"""

from __future__ import annotations

from typing import Any

from agents.finish_reasons import FinishReason
from agents.time_split import TimeSplit
from core.models import Outcome

# API errors the policy's own use explains: what it generated filled its context or budget.
POLICY_ERRORS = frozenset({"context_length_exceeded", "token_budget_exceeded"})
DEADLINE_ERROR = "deadline_exceeded"


def refusals(errors: dict[str, int]) -> int:
    """Calls the endpoint refused for reasons that are not the policy's (4xx of any other kind)."""
    return sum(n for kind, n in errors.items() if kind not in POLICY_ERRORS and kind != DEADLINE_ERROR)


def classify(ending: Any, counters: Any, split: TimeSplit) -> tuple[str, str]:
    """(outcome, finish_reason) of a harness RUN; see the module table."""
    if ending.outcome == Outcome.COMPLETED.value:
        return ending.outcome, ending.finish_reason
    errors = dict(counters.errors or {})
    if refusals(errors):
        return Outcome.INFRA_ERROR.value, FinishReason.ENDPOINT_REFUSED.value
    if counters.calls - counters.failed_calls <= 0:
        return Outcome.INFRA_ERROR.value, FinishReason.HARNESS_START.value
    if ending.finish_reason == FinishReason.DEADLINE.value or errors.get(DEADLINE_ERROR):
        return split.deadline_outcome(), FinishReason.DEADLINE.value  # whose time ran out?
    return ending.outcome, ending.finish_reason
