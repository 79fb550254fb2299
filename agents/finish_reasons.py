"""Why a turn or a rollout ended: one vocabulary, one table (docs/trajectories.md copies it).

`finish_reason` of a **turn** (`Turn.finish_reason`) says how one generation stopped;
`finish_reason` of a **rollout** says why the episode ended. A trainer filters on the rollout's
`outcome` first (only `completed` rollouts are graded samples) and may use the finish reason
and `metrics.truncated` for overlong filtering or shaping.

| value | turn | rollout | meaning | outcome |
| --- | --- | --- | --- | --- |
| `stop` | yes | - | the model ended its turn (an end-of-turn token or a stop string) | - |
| `turn_length` | yes | if `limits.continue_after_turn_length` is false | cut at `sampling.max_tokens`; by default the episode goes on (the model is told its reply was cut, nothing in it runs) | `completed` |
| `context` | yes | yes | the context window is full: prompt + turns reached the effective context (min of `llm.max_model_len` and the server's `max_model_len`) | `completed`; `prompt_too_long` when it happened before the first token |
| `token_budget` | yes | yes | `limits.max_tokens` generated tokens were produced (tool observations do not count) | `completed` |
| `finish` | - | yes | the agent called its finish tool or gave a final answer | `completed` |
| `max_turns` | - | yes | `limits.max_turns` (or the handler's) turns were taken | `completed` |
| `stale` | - | yes | with `limits.on_stale="stop"`: the turns spanned more than `limits.max_staleness` weight updates | `completed` (metrics.stale) |
| `no_valid_action` | - | yes | N turns in a row without a valid tool call | `agent_error` |
| `deadline` | - | yes | the RUN deadline (or a harness's own `timeout`) passed; whose time ran out decides (`agents.time_split`: the agent's own generation and tools or harness work at least half of the charged time) | `agent_error` (reward 0, not graded), else `timeout` |
| `disk_quota` | - | yes | the workspace outgrew `sandbox.limits.disk_mb`; a watchdog stopped the sandbox | `agent_error` (reward 0) |
| `oom` | - | yes | the tool server died and the sandbox's memory cgroup recorded an OOM kill | `agent_error` (reward 0) |
| `tool_server_died` | - | yes | the agent's own processes took its tool server down (e.g. killed it; only possible where tools are not isolated from the server) | `agent_error` (reward 0) |
| `tool_server_unresponsive` | - | yes | the tool server stopped answering because of the agent: stopped (SIGSTOP) or traced by its processes, or starved by its fork bomb at the pids limit | `agent_error` (reward 0) |
| `harness_exit` | - | yes | a registered harness (`agent: harness`) exited with a non-zero status or crashed; its artifact is still graded | `agent_error` |
| `endpoint_refused` | - | yes | a harness exited non-zero or timed out after its endpoint refused a request (an unsupported feature, a malformed body, a wrong route or token): harness and endpoint do not fit, not the policy's doing (`agents/handlers/harness/ending.py`) | `infra_error` (not graded) |
| `harness_start` | - | yes | a harness exited non-zero or timed out before one model call was answered (it cannot start or hung: the policy never acted) | `infra_error` (not graded) |
| `cancelled` | - | yes | the job or rollout was cancelled | `cancelled` |
"""

from __future__ import annotations

import enum


class FinishReason(str, enum.Enum):
    """Why a generation (turn) or an episode (rollout) stopped; see the module table."""

    STOP = "stop"
    TURN_LENGTH = "turn_length"
    CONTEXT = "context"
    TOKEN_BUDGET = "token_budget"
    FINISH = "finish"
    MAX_TURNS = "max_turns"
    STALE = "stale"
    NO_VALID_ACTION = "no_valid_action"
    DEADLINE = "deadline"
    HARNESS_EXIT = "harness_exit"
    ENDPOINT_REFUSED = "endpoint_refused"
    HARNESS_START = "harness_start"
    CANCELLED = "cancelled"
    DISK_QUOTA = "disk_quota"
    OOM = "oom"
    TOOL_SERVER_DIED = "tool_server_died"
    TOOL_SERVER_UNRESPONSIVE = "tool_server_unresponsive"


# The agent broke its own sandbox: agent_error with reward 0, no EVAL (never infra_error).
SELF_INFLICTED = frozenset(
    {
        FinishReason.DISK_QUOTA.value,
        FinishReason.OOM.value,
        FinishReason.TOOL_SERVER_DIED.value,
        FinishReason.TOOL_SERVER_UNRESPONSIVE.value,
    }
)


# The deadline passed while the agent's own actions used the time (`agents.time_split`).
POLICY_DEADLINE = ("agent_error", FinishReason.DEADLINE.value)


# Generation cuts: the turn's text is incomplete, so its tool calls are never executed.
CUT_TURN = frozenset({FinishReason.TURN_LENGTH.value, FinishReason.CONTEXT.value, FinishReason.TOKEN_BUDGET.value})
# Episodes stopped by a limit rather than by the agent (`metrics.truncated` is true).
TRUNCATING = frozenset(
    {
        FinishReason.TURN_LENGTH.value,
        FinishReason.CONTEXT.value,
        FinishReason.TOKEN_BUDGET.value,
        FinishReason.MAX_TURNS.value,
        FinishReason.STALE.value,
    }
)
