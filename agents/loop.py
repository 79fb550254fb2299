"""The one multi-turn agent loop every handler runs: generate, call tools, observe, repeat.

One implementation for all handlers so the hard parts are right everywhere: each turn is
handed to the turn log (`ctx.record_turn`) and durable (`ctx.settle_turns`) before the next
turn's tool calls run, its commit overlapping the next generation; the episode ends for a precise reason
(`agents.finish_reasons`: finish tool, max turns, full context, generated-token budget,
staleness, deadline, N turns with no valid action); a turn cut at its per-turn length goes on
by default; a prompt that does not fit is `prompt_too_long`, not a sample; cancel unwinds
through `RolloutCancelled` for the pipeline to record. Tool misuse and malformed calls are
observations for the model, counted in the rollout's metrics. The trajectory itself is the
LLM session's (token-exact); this loop never re-tokenizes model output.

Resume: each turn is logged with the messages appended after it and the loop's counters
(`loop_state`), so a RUN whose worker died continues from `ctx.resume_turns` (the attempt's
logged turns, same sandbox) at the next turn index: the session is rebuilt token for token
(`agents.llm.replay`), nothing logged is generated or executed again. The turn that was in
flight is not logged (a turn is logged after its tool calls ran), so it is generated again;
whatever its tool calls had done in the sandbox before the worker died stays there, like any
other side effect of a shell the agent holds. When the sandbox itself was lost, the new
attempt's `ctx.resume_turns` are the earlier attempt's: their tool calls are replayed into the
rebuilt sandbox first (`agents.loop_replay`), and the loop goes on from there.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from agents.abstract import AgentLoopConfig, Trajectory
from agents.contexts import RunContext
from agents.counters import RolloutCounters
from agents.finish_reasons import CUT_TURN, TRUNCATING, FinishReason
from agents.llm import parse_tool_calls
from agents.llm.replay import prompt_digest, replay_turns
from agents.loop_replay import replay_into_sandbox
from agents.time_split import SessionClock, TimeSplit
from agents.prompt_fit import prompt_messages
from agents.tools import Tool, ToolOutput, call_tool
from core.errors import ResumeError, StageTimeout
from core.models import Outcome
from sandbox.errors import SandboxError

log = logging.getLogger(__name__)

DEFAULT_MAX_OBSERVATION_CHARS = 12_000
NO_TOOL_CALL_MESSAGE = (
    "No tool call found in your reply. Call one of the tools ({names}) "
    'using <tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call>.'
)
TURN_CUT_MESSAGE = (
    "Your reply was cut off at the limit of {n} tokens per turn, so nothing in it was run. Reply again, shorter."
)


# Names the episode's counters had in `loop_state`s logged before `agents.counters` (read on resume).
OLD_STATE_NAMES = {"parse_errors": "malformed_tool_calls"}


@dataclass
class _Episode(RolloutCounters):
    """The shared counters (`agents.counters`), the loop's own and the stop reason of one run
    of the loop."""

    invalid_tool_calls: int = 0  # tool calls a tool refused (unknown tool, bad arguments, ...)
    invalid_streak: int = 0
    gen_seconds: float = 0.0  # the policy's generation (`agents.time_split`)
    wait_seconds: float = 0.0  # generate calls waiting on the infrastructure
    paused_seconds: float = 0.0  # waited on a paused pool: not the agent's time
    tool_seconds: float = 0.0
    outcome: str = Outcome.COMPLETED.value
    finish_reason: str | None = None
    answer: Any = None
    finished: bool = False
    tool_names_used: dict[str, int] = field(default_factory=dict)
    max_invalid_turns: int = 3
    resumed_from: list[int] = field(default_factory=list)  # turn index of each resume
    # Logged turns of an earlier attempt this attempt replayed into its rebuilt sandbox, and
    # the calls whose output differed (`agents.loop_replay`).
    replayed_turns: int = 0
    replay_divergences: list[dict[str, Any]] = field(default_factory=list)
    replay_seconds: float = 0.0  # wall time of that replay (a branch's cost before it samples)
    restored_turns: int = 0  # carried by a workspace checkpoint, nothing run again
    checkpoints: dict[str, Any] = field(default_factory=dict)  # `tasks.sandboxing.checkpoints`
    # The rendered prompt's digest (`replay.prompt_digest`), logged with every turn and checked
    # on resume: the prompt never changes within an episode, so it is hashed once.
    prompt_digest: str | None = None


def run_agent_loop(
    ctx: RunContext,
    *,
    system_prompt: str,
    user_prompt: str,
    tools: list[Tool],
    max_turns: int | None = None,
    max_invalid_turns: int = 3,
    final_answer: Callable[[str], Any] | None = None,
    max_observation_chars: int = DEFAULT_MAX_OBSERVATION_CHARS,
) -> Trajectory:
    """Drive `ctx.llm` with `tools` until the agent finishes or a limit stops it.

    `final_answer(text)`, if given, is asked about every reply that has no tool call: a
    non-None result ends the episode with that answer (e.g. a `\\boxed{}` final message).
    `max_turns` defaults to the job's `limits.max_turns`. Raises `RolloutCancelled` on cancel.
    """
    by_name = {tool.name: tool for tool in tools}
    max_turns = max_turns or ctx.limits.max_turns
    ctx.llm.start(_prompt_messages(ctx, system_prompt, user_prompt, tools), tools=[tool.schema() for tool in tools])
    ep = _Episode(max_invalid_turns=max_invalid_turns)
    if ctx.resume_turns:
        ep = _resumed(ctx, ctx.resume_turns)
        _replay_lost_sandbox(ctx, ep, by_name, max_observation_chars)
    ep.prompt_digest = prompt_digest(ctx.llm.trajectory().prompt_ids)
    clock = _Clock(ctx, ep)
    split: TimeSplit | None = None  # as it stood at the deadline, when one passed
    try:
        while ep.finish_reason is None:
            ep.finish_reason = _limit_reached(ctx, ep, max_turns)
            if ep.finish_reason is None:
                ctx.turn_boundary()  # a draining node hands the rollout back here: nothing in flight
                _one_turn(ctx, ep, by_name, final_answer, max_invalid_turns, max_observation_chars, clock)
    except StageTimeout:
        # whose time ran out: the agent's own actions (policy) or infrastructure waits
        split = clock.split(ctx, ep)
        ep.outcome, ep.finish_reason = split.deadline_outcome(), FinishReason.DEADLINE.value
    except SandboxError as exc:
        reason = ctx.diagnose(exc)
        if reason is None:
            raise  # infrastructure: the pipeline retries
        ep.outcome, ep.finish_reason = Outcome.AGENT_ERROR.value, reason
    if ep.turns == 0 and ep.finish_reason == FinishReason.CONTEXT.value:
        # Not a sample: the prompt alone fills the context. Never graded as reward 0.
        ep.outcome = Outcome.PROMPT_TOO_LONG.value
    log.info("rollout %s: loop ended after %d turns: %s (%s)", ctx.rollout_id, ep.turns, ep.outcome, ep.finish_reason)
    ctx.settle_turns()  # the last turn too: the loop returns only what the log holds
    result = _result(ctx, ep)
    result.metrics["time_split"] = (split or clock.split(ctx, ep)).to_metrics()  # the one decided on
    if ep.replayed_turns and clock.first_reply_at is not None:  # when the replayed RUN went live
        result.metrics["first_live_reply_at"] = round(clock.first_reply_at, 3)
    result.extra["tools"] = [tool.schema() for tool in tools]  # what the model was offered
    return result


def run_configured_loop(
    ctx: RunContext,
    cfg: AgentLoopConfig,
    *,
    user_prompt: str,
    tools: list[Tool],
    final_answer: Callable[[str], Any] | None = None,
) -> Trajectory:
    """`run_agent_loop` as a handler runs it: the system prompt and the turn limits from its
    loop config (`AgentLoopConfig`), the user prompt and tools it made for this instance."""
    return run_agent_loop(
        ctx,
        system_prompt=cfg.system_prompt,
        user_prompt=user_prompt,
        tools=tools,
        max_turns=cfg.max_turns,
        max_invalid_turns=cfg.max_invalid_turns,
        final_answer=final_answer,
    )


class _Clock:
    """This RUN execution's time split: the session's clock and the tools' seconds since
    the loop started (a resumed RUN counts its own time: its deadline is its own), the
    elapsed time from the stage's start (its deadline minus the RUN timeout)."""

    def __init__(self, ctx: RunContext, ep: _Episode) -> None:
        self.started = ctx.deadline - ctx.limits.stage_timeout("run")
        self.base = SessionClock(ep.gen_seconds, ep.wait_seconds, ep.paused_seconds)
        self.tools_before = ep.tool_seconds
        self.first_reply_at: float | None = None  # wall clock of this execution's first reply

    def sync(self, ctx: RunContext, ep: _Episode) -> SessionClock:
        """Bring the episode's generation/waiting/paused counters up to the session's."""
        now = ctx.llm.clock
        ep.gen_seconds = self.base.generation + now.generation
        ep.wait_seconds = self.base.waiting + now.waiting
        ep.paused_seconds = self.base.paused + now.paused
        return now

    def split(self, ctx: RunContext, ep: _Episode) -> TimeSplit:
        """The split of this execution so far (`agents.time_split`)."""
        now = self.sync(ctx, ep)
        return TimeSplit(
            elapsed=time.monotonic() - self.started,
            generation=now.generation,
            agent_own=ep.tool_seconds - self.tools_before,
            waiting=now.waiting,
            paused=now.paused,
        )


def _resumed(ctx: RunContext, turns: list[dict[str, Any]]) -> _Episode:
    """The episode after the logged `turns`, with the session rebuilt from them."""
    state = turns[-1].get("loop_state")
    if not state:
        raise ResumeError(f"turn {turns[-1].get('index')} was logged without the loop's state")
    replay_turns(ctx.llm, turns, state.get("prompt_digest"))
    known = {f.name for f in fields(_Episode)}
    state = {OLD_STATE_NAMES.get(k, k): v for k, v in state.items()}
    ep = _Episode(**{k: v for k, v in state.items() if k in known})
    ep.resumed_from.append(len(turns))
    own = [t for t in turns if t.get("attempt", ctx.attempt) == ctx.attempt]
    if own:  # an earlier attempt's handler state names its own sandbox: replay rebuilds it
        ctx.state.clear()  # what the handler's tools kept in it (e.g. passages seen) by then
        ctx.state.update((own[-1].get("loop_state") or {}).get("handler_state") or {})
    log.info(
        "rollout %s: RUN resumed at turn %d (%s)",
        ctx.rollout_id,
        len(turns),
        "episode already over" if ep.finish_reason else "continuing",
    )
    return ep


def _replay_lost_sandbox(ctx: RunContext, ep: _Episode, tools: dict[str, Tool], limit: int) -> None:
    """Turns an earlier attempt logged: their tool calls run again in this attempt's rebuilt
    sandbox before the loop goes on (`agents.loop_replay`)."""
    started = time.monotonic()
    done = replay_into_sandbox(ctx, ctx.resume_turns or [], tools, lambda text: _clip(text, limit), ep.checkpoints)
    if done is not None:
        ep.replayed_turns, ep.restored_turns, ep.replay_divergences = done.replayed, done.restored, done.divergences
        ep.replay_seconds = round(time.monotonic() - started, 4)


def _loop_state(ctx: RunContext, ep: _Episode) -> dict[str, Any]:
    """The counters logged with a turn, the prompt's digest (checked on resume) and the
    handler's `ctx.state` (its tools may keep things there during RUN)."""
    return {**asdict(ep), "handler_state": dict(ctx.state)}


def _prompt_messages(ctx: RunContext, system_prompt: str, user_prompt: str, tools: list[Tool]) -> list[dict[str, Any]]:
    return prompt_messages(system_prompt, user_prompt, tools, _template_renders_tools(ctx.llm))


def _template_renders_tools(llm: Any) -> bool:
    tokenizer = getattr(getattr(llm, "builder", None), "tok", None)
    return bool(getattr(tokenizer, "supports_tools", True))


def _limit_reached(ctx: RunContext, ep: _Episode, max_turns: int) -> str | None:
    """The finish reason if the episode must stop before another generation, else None."""
    ctx.checkpoint()  # RolloutCancelled propagates; StageTimeout ends the loop as a timeout
    trajectory = ctx.llm.trajectory()
    if ep.turns >= max_turns:
        return FinishReason.MAX_TURNS.value
    if trajectory.finish_reason == FinishReason.CONTEXT.value or ctx.llm.budget_left <= 0:
        return FinishReason.CONTEXT.value
    if _tokens_left(ctx) == 0:
        return FinishReason.TOKEN_BUDGET.value
    limit = ctx.limits.max_staleness
    if limit is not None and ctx.limits.on_stale == "stop" and staleness(trajectory.policy_versions) > limit:
        return FinishReason.STALE.value
    return None


def _tokens_left(ctx: RunContext) -> int | None:
    """Generated tokens left under `limits.max_tokens` (None = no budget)."""
    budget = ctx.limits.max_tokens
    if not budget:
        return None
    return max(0, int(budget) - sum(ctx.llm.trajectory().loss_mask))


def staleness(weight_versions: list[str | None]) -> int:
    """Weight updates a rollout's turns span: distinct versions in order of use, minus one."""
    seen: list[str | None] = []
    for version in weight_versions:
        if not seen or seen[-1] != version:
            seen.append(version)
    return max(0, len(seen) - 1)


def _one_turn(
    ctx: RunContext,
    ep: _Episode,
    tools: dict[str, Tool],
    final_answer: Callable[[str], Any] | None,
    max_invalid_turns: int,
    max_observation_chars: int,
    clock: _Clock,
) -> None:
    """Generate, act, observe and log one turn; sets `ep.finish_reason` when it ends.

    The turn is logged last, with the counters as they stand after it (what resume reads).
    """
    gen = ctx.llm.generate(ctx.deadline, ctx.cancel_check, max_new_tokens=_tokens_left(ctx))
    clock.first_reply_at = clock.first_reply_at or time.time()
    ctx.extend_deadline(getattr(gen, "paused_seconds", 0.0))  # a weight push paused the pool:
    clock.sync(ctx, ep)  # the agent's clock stood still
    if not gen.token_ids and gen.finish_reason in CUT_TURN:
        ep.finish_reason = gen.finish_reason  # no room left: nothing was generated
        return
    index, ep.turns = ep.turns, ep.turns + 1
    calls, errors = parse_tool_calls(gen.text or "")
    ep.malformed_tool_calls += len(errors)
    ep.replies_without_tool_call += int(bool(tools) and not calls)
    ctx.settle_turns()  # the turns before this one are durable before its tool calls run
    if gen.finish_reason in CUT_TURN:
        messages, tool_seconds = _cut_turn(ctx, ep, gen), 0.0
    else:
        messages, tool_seconds = _act(
            ctx, ep, tools, calls, errors, gen, final_answer, max_invalid_turns, max_observation_chars
        )
    observation_ids = ctx.llm.append_messages(messages) if messages else []
    _record(ctx, ep, index, gen, calls, messages, observation_ids, tool_seconds, errors)
    if ctx.checkpoints is not None:  # the workspace as this turn left it (`tasks.sandboxing.checkpoints`)
        ctx.checkpoints.save(index, ep.checkpoints)


def _act(
    ctx: RunContext,
    ep: _Episode,
    tools: dict[str, Tool],
    calls: list[Any],
    errors: list[str],
    gen: Any,
    final_answer: Callable[[str], Any] | None,
    max_invalid_turns: int,
    max_observation_chars: int,
) -> tuple[list[dict], float]:
    """Run the turn's calls; returns the messages to append ([] when the episode finished)
    and the seconds the tools took."""
    tool_started = time.monotonic()
    outputs = _execute(ctx, ep, tools, calls)
    tool_seconds = time.monotonic() - tool_started
    ep.tool_seconds += tool_seconds
    valid = [o for o in outputs if not o.error]
    ep.invalid_streak = 0 if valid else ep.invalid_streak + 1
    finish = next((o for o in outputs if o.finish), None)
    if finish is None and not calls and not errors and final_answer is not None:
        answer = final_answer(gen.text or "")
        if answer is not None:
            finish = ToolOutput("", finish=True, answer=answer)
            ep.invalid_streak = 0
    if finish is not None:
        ep.finished, ep.answer, ep.finish_reason = True, finish.answer, FinishReason.FINISH.value
        return [], tool_seconds
    if ep.invalid_streak >= max_invalid_turns:
        ep.outcome = Outcome.AGENT_ERROR.value
        ep.finish_reason = FinishReason.NO_VALID_ACTION.value
    return _observation_messages(tools, calls, outputs, errors, max_observation_chars), tool_seconds


def _cut_turn(ctx: RunContext, ep: _Episode, gen: Any) -> list[dict]:
    """A generation cut short: its calls are incomplete by construction, never executed.

    A per-turn cut goes on by default (the model is told, and it counts as a turn without a
    valid action); a full context or an exhausted token budget ends the episode. Returns the
    message to append ([] when the episode ends).
    """
    reason = gen.finish_reason
    go_on = reason == FinishReason.TURN_LENGTH.value and ctx.limits.continue_after_turn_length
    if not go_on:
        ep.finish_reason = reason
        return []
    ep.invalid_streak += 1
    if ep.invalid_streak >= ep.max_invalid_turns:
        ep.outcome = Outcome.AGENT_ERROR.value
        ep.finish_reason = FinishReason.NO_VALID_ACTION.value
    return [{"role": "user", "content": TURN_CUT_MESSAGE.format(n=len(gen.token_ids))}]


def _execute(ctx: RunContext, ep: _Episode, tools: dict[str, Tool], calls: list[Any]) -> list[ToolOutput]:
    """Run the turn's calls in order; a finishing call ends the turn (later calls are skipped)."""
    outputs = []
    for call in calls:
        output = call_tool(ctx, tools, call.name, call.arguments)
        ep.tool_calls += 1
        ep.invalid_tool_calls += int(output.error)
        ep.tool_names_used[call.name] = ep.tool_names_used.get(call.name, 0) + 1
        outputs.append(output)
        if output.finish:
            break
    return outputs


def _observation_messages(
    tools: dict[str, Tool], calls: list[Any], outputs: list[ToolOutput], errors: list[str], limit: int
) -> list[dict[str, Any]]:
    """One `tool` message per executed call and per malformed call; a nudge if there were none."""
    messages = [
        {"role": "tool", "name": call.name, "content": _clip(out.text, limit)} for call, out in zip(calls, outputs)
    ]
    messages += [{"role": "tool", "content": f"Error: malformed tool call: {error}"} for error in errors]
    if not messages:
        names = ", ".join(tools)
        messages = [{"role": "user", "content": NO_TOOL_CALL_MESSAGE.format(names=names)}]
    return messages


def _clip(text: str, limit: int) -> str:
    """Keep the head and the tail of an over-long observation, saying how much was cut."""
    if len(text) <= limit:
        return text
    head, tail = text[: limit // 2], text[-(limit // 2) :]
    return f"{head}\n[... {len(text) - len(head) - len(tail)} characters elided ...]\n{tail}"


def _record(
    ctx: RunContext,
    ep: _Episode,
    index: int,
    gen: Any,
    calls: list[Any],
    messages: list[dict],
    observation_ids: list[int],
    tool_seconds: float,
    errors: list[str],
) -> None:
    """Log one turn (the pipeline writes it to the Turn table before we go on)."""
    ctx.record_turn(
        index=index,
        generated_ids=list(gen.token_ids),
        logprobs=list(gen.logprobs or []),
        text=gen.text,
        tool_calls=[c.to_dict() for c in calls],
        observation="\n".join(m["content"] for m in messages) if messages else None,
        observation_ids=list(observation_ids),
        observation_messages=messages,
        finish_reason=gen.finish_reason,
        llm_server=gen.server,
        weight_version=gen.weight_version,
        gen_seconds=gen.latency,
        tool_seconds=tool_seconds,
        extra=_turn_extra(ctx, gen, errors),
        loop_state=_loop_state(ctx, ep),
    )


def _turn_extra(ctx: RunContext, gen: Any, errors: list[str]) -> dict[str, Any]:
    extra: dict[str, Any] = {"parse_errors": errors} if errors else {}
    extra["context_length"] = ctx.llm.context_length  # replayed before this generation
    if ctx.workspace:  # masked when a rebuilt sandbox replays the turn (`agents.loop_replay`)
        extra["workspace"] = ctx.workspace
    if getattr(gen, "logprobs_mode", None):
        extra["logprobs_mode"] = gen.logprobs_mode
    return extra


def _distinct(values: list[Any]) -> list[Any]:
    return list(dict.fromkeys(values))


def _result(ctx: RunContext, ep: _Episode) -> Trajectory:
    """The record: the session's trajectory plus the episode's ending, counters and answer."""
    traj = ctx.llm.trajectory()
    metrics: dict[str, Any] = {
        **ep.metrics(),
        "invalid_tool_calls": ep.invalid_tool_calls,
        "tool_calls_by_name": ep.tool_names_used,
        "finished": ep.finished,
        "gen_seconds": round(ep.gen_seconds, 4),
        "wait_seconds": round(ep.wait_seconds, 4),
        "tool_seconds": round(ep.tool_seconds, 4),
        "paused_seconds": round(ep.paused_seconds, 4),
        "response_tokens": len(traj.response_ids),
        "generated_tokens": sum(traj.loss_mask),
        "truncated": ep.finish_reason in TRUNCATING,
        "context_length": ctx.llm.context_length,
        "logprobs_mode": ctx.llm.logprobs_mode,
        "weight_versions": _distinct(traj.policy_versions),
        "staleness": staleness(traj.policy_versions),
    }
    if ep.resumed_from:  # the RUN was lost and continued from the logged turns
        metrics["resumed_from_turn"] = ep.resumed_from[-1]
        metrics["resumes"] = len(ep.resumed_from)
    if ep.replayed_turns:  # the sandbox was lost and rebuilt by replaying the logged turns
        metrics["replayed_turns"] = ep.replayed_turns
        metrics["replay_divergences"] = ep.replay_divergences
        metrics["replay_seconds"] = ep.replay_seconds
    if ep.restored_turns or ep.checkpoints:  # a workspace checkpoint carried turns, or was saved
        metrics["restored_turns"], metrics["checkpoints"] = ep.restored_turns, ep.checkpoints
    if ctx.limits.max_staleness is not None:
        metrics["stale"] = metrics["staleness"] > ctx.limits.max_staleness
    metrics.update(ctx.llm.audit_drift())
    # The session's own record with how the episode ended: the same type the stages store and
    # the trainer reads. Its lists are copied (the session's are live until RUN closes it);
    # list() per array, not a deep copy, which costs ~100x more on a long trajectory.
    fresh = {name: list(value) for name, value in traj if isinstance(value, list)}
    fresh["messages"] = [dict(m) for m in traj.messages]
    return traj.model_copy(
        update={
            **fresh,
            "outcome": ep.outcome,
            "finish_reason": ep.finish_reason,
            "metrics": metrics,
            "extra": {"answer": ep.answer, **copy.deepcopy(traj.extra)},
        }
    )
