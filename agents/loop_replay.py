"""Replay into a rebuilt sandbox: an earlier attempt's logged tool calls, run again in order.

A rollout whose sandbox was lost (node loss, `scancel`, a time limit, a preemption) gets a new
attempt: INIT starts a fresh sandbox from the same instance, and RUN receives the logged turns
of the attempt that lost it (`tasks.recovery.resume.turns_to_resume`). The LLM session is rebuilt from
them token for token (`agents.llm.replay`); here their tool calls are executed again in the new
sandbox, turn by turn and with no generation, each output compared with the logged observation,
and each turn logged again under this attempt (the attempt's own log is then complete, so a
later loss replays from it, and a worker that dies mid-replay resumes the replay). The policy's
observations are always the logged ones: the trainer gets the logged trajectory plus the turns
generated after it, one prefix-consistent sequence.

A replayed output that differs from the logged one is a divergence, recorded on its turn
(`extra.replay_divergences`) and in `metrics.replay_divergences`. What legitimately differs
between two sandboxes of the same instance is masked before comparing, and nothing else: the
workspace path (each attempt has its own) and pytest's run time (`N passed in 0.12s`). The job
chooses what a divergence does (`resume.on_divergence`): `restart`, the default, raises
`ReplayDiverged` and the pipeline starts a new attempt from INIT that replays nothing;
`continue` goes on in the sandbox as replay left it.

With workspace checkpoints (`resume.checkpoints`, `tasks.sandboxing.checkpoints`) the fresh
sandbox first gets the latest checkpoint the earlier attempt saved (after its turn j): turns
up to j are logged again without running anything (`extra.restored_from_checkpoint`), and only
the turns after j are replayed. Only the workspace is restored: what turns up to j left in
processes (the shell's directory, a Python session's variables) or outside the workspace is
not there, which is why checkpoints are a job's choice.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agents.contexts import RunContext
from agents.finish_reasons import CUT_TURN
from agents.tools import Tool, call_tool
from core.errors import ReplayDiverged

log = logging.getLogger(__name__)

# The columns the loop logs a turn with (`agents.loop._record`): a replayed turn is logged
# again under the new attempt with the same ones.
LOGGED = (
    "index",
    "generated_ids",
    "logprobs",
    "text",
    "tool_calls",
    "observation",
    "observation_ids",
    "observation_messages",
    "finish_reason",
    "llm_server",
    "weight_version",
    "gen_seconds",
    "tool_seconds",
    "extra",
    "loop_state",
)
PYTEST_TIME = re.compile(r" in \d+(?:\.\d+)?s\b")  # "1 passed in 0.12s": a run time, not a result
EXCERPT = 200  # characters of each side kept in a divergence record


@dataclass
class Carried:
    """What the rebuilt sandbox got of the earlier attempt's turns: replayed (tool calls run
    again), restored (from its workspace checkpoint, nothing run) and the divergences."""

    replayed: int = 0
    restored: int = 0
    divergences: list[dict[str, Any]] = field(default_factory=list)


def replay_into_sandbox(
    ctx: RunContext,
    turns: list[dict[str, Any]],
    tools: dict[str, Tool],
    clip: Callable[[str], str],
    checkpoints: dict[str, Any] | None = None,
) -> Carried | None:
    """Run the tool calls of the turns other attempts logged (they follow this attempt's own
    turns in `turns`) and log them again here; None when every turn is this attempt's own.
    `clip` is the loop's cut of an over-long observation (the logged ones were cut by it).
    With workspace checkpoints (`ctx.checkpoints`) a fresh sandbox first gets the earlier
    attempt's latest one, and only the turns after it are replayed (`checkpoints`: the
    episode's counts)."""
    own = [t for t in turns if t.get("attempt", ctx.attempt) == ctx.attempt]
    if len(own) == len(turns):
        return None
    base = (own[-1].get("loop_state") or {}) if own else {}
    done = Carried(
        int(base.get("replayed_turns") or 0),
        int(base.get("restored_turns") or 0),
        list(base.get("replay_divergences") or []),
    )
    # The last turn the restored checkpoint holds: a RUN resumed in place after it logged some
    # of the restored turns goes on in the sandbox the restore made, restoring nothing again.
    through = max((_restored_through(t) for t in own), default=-1)
    if not own and ctx.checkpoints is not None:  # a fresh sandbox: nothing of the turns is in it
        through = ctx.checkpoints.restore(turns[0]["attempt"], turns[-1]["index"], checkpoints or {})
    for turn in turns[len(own) :]:
        ctx.checkpoint()  # a cancel or the deadline stops a replay like a turn
        if turn["index"] <= through:
            done.restored += 1
            _log_again(ctx, turn, [], done, restored=through)
            continue
        ctx.settle_turns()  # the turns before this one durable before its calls run again
        found = _replay_turn(ctx, turn, tools, clip)
        done.divergences += found
        if found and ctx.job_config.resume.on_divergence == "restart":
            first = found[0]
            raise ReplayDiverged(
                f"replayed turn {first['turn']} diverged ({first['tool']}: logged {first['logged']!r}, "
                f"replayed {first['replayed']!r}); starting over from INIT",
                divergences=done.divergences,
            )
        done.replayed += 1
        _log_again(ctx, turn, found, done)
    if ctx.checkpoints is not None:  # this attempt's own, so a loss from here restores it
        ctx.checkpoints.save(turns[-1]["index"], checkpoints if checkpoints is not None else {})
    log.info(
        "rollout %s: %d logged turn(s) restored from a checkpoint, %d replayed into the rebuilt sandbox, "
        "%d divergence(s)",
        ctx.rollout_id,
        done.restored,
        done.replayed,
        len(done.divergences),
    )
    return done


def _restored_through(turn: dict[str, Any]) -> int:
    """The checkpoint turn a carried turn was restored from (-1: it was not)."""
    mark = (turn.get("extra") or {}).get("restored_from_checkpoint")
    return int(mark) if mark is not None else -1


def _replay_turn(
    ctx: RunContext, turn: dict[str, Any], tools: dict[str, Tool], clip: Callable[[str], str]
) -> list[dict[str, Any]]:
    """Run one logged turn's calls as the loop ran them; its divergences."""
    if turn.get("finish_reason") in CUT_TURN:
        return []  # a cut generation's calls were never run
    logged = [m.get("content") for m in turn.get("observation_messages") or [] if m.get("role") == "tool"]
    then = (turn.get("extra") or {}).get("workspace")
    found = []
    for k, call in enumerate(turn.get("tool_calls") or []):
        output = call_tool(ctx, tools, call["name"], call.get("arguments") or {})
        if output.finish:  # the loop ran no call after a finishing one
            break
        if k >= len(logged):  # the episode ended at this turn: nothing was observed
            continue
        text = clip(output.text)
        if _masked(text, ctx.workspace, then) != _masked(logged[k] or "", None, None):
            found.append(
                {
                    "turn": turn["index"],
                    "call": k,
                    "tool": call["name"],
                    "logged": (logged[k] or "")[:EXCERPT],
                    "replayed": text[:EXCERPT],
                }
            )
    return found


def _masked(text: str, now: str | None, then: str | None) -> str:
    """`text` with what two sandboxes of one instance may differ in made equal."""
    if now and then and now != then:
        text = text.replace(now, then)
    return PYTEST_TIME.sub(" in <time>", text)


def _log_again(
    ctx: RunContext, turn: dict[str, Any], found: list[dict[str, Any]], done: Carried, restored: int | None = None
) -> None:
    """Log a carried turn under this attempt: as logged (the policy's observations stay the
    logged ones), noting where it came from (`replayed_from_attempt` on every carried turn:
    what `app.recovery_costs` counts as not generated again; `restored_from_checkpoint`, the
    checkpoint's turn, on those whose calls were not run again), what diverged, and the
    handler state the replay built (an earlier attempt's names its own sandbox)."""
    fields = {name: turn.get(name) for name in LOGGED}
    # `extra.workspace` stays the one the observation was produced in (what a later replay masks)
    extra = {**(turn.get("extra") or {}), "replayed_from_attempt": turn.get("attempt")}
    extra.pop("restored_from_checkpoint", None)
    if restored is not None:
        extra["restored_from_checkpoint"] = restored
    if found:
        extra["replay_divergences"] = found
    else:
        extra.pop("replay_divergences", None)
    fields["extra"] = extra
    fields["loop_state"] = {
        **(turn.get("loop_state") or {}),
        "handler_state": dict(ctx.state),
        "replayed_turns": done.replayed,
        "restored_turns": done.restored,
        "replay_divergences": list(done.divergences),
    }
    ctx.record_turn(**fields)
