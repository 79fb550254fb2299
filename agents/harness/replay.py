"""Answering a restarted harness from the log: an earlier attempt's model calls, in order.

A harness cannot be re-attached to: when its RUN is lost (a killed worker, a lost node), the
rollout gets a new attempt from INIT in a fresh sandbox and the harness starts over from its
first call. That attempt's RUN receives the calls the earlier attempt logged
(`tasks.recovery.resume.turns_to_resume`), and the endpoint answers each call whose prompt is
the logged call's prompt from the log: the same generated ids, logprobs, text, tool calls (and
their ids), weight version, with no generation. The first call whose prompt differs (the
harness saw another observation, or the log ran out) is generated live, and so is every call
after it: the record is this attempt's calls, one prefix-consistent trajectory, each replayed
call logged again under this attempt (`extra.replayed_from_attempt`), so a later loss replays
from this attempt's log. Only the call in flight at the loss (never logged) is generated twice.

Matching is by the prepared prompt (`samples.Prepared`): the same sample, the same way (a merge
or a new sample), the same ids (the whole prompt of a new sample, the template delta of a
merge; the calls before matched, so the sequences are equal). What legitimately differs
between two sandboxes of one instance is masked, and nothing else: the workspace path (each
attempt has its own, and the task text names it). A call matched only under that mask is noted
on its turn (`extra.replay_masked`); a difference is recorded in `metrics.replay_divergences`
and on the first live turn (`extra.replay_divergence`).
"""

from __future__ import annotations

from typing import Any

from agents.harness.samples import Prepared
from agents.llm.backends.abstract import Generation

EXCERPT = 200  # characters of each side kept in a divergence record


class CallReplay:
    """The logged calls of the attempt this one replaces, answered in order while they match."""

    def __init__(self, turns: list[dict[str, Any]], workspace: str | None) -> None:
        self.turns = turns  # index order, from 0
        self.workspace = workspace  # this attempt's (masked to the logged one's)
        self.next = 0  # the logged call the next request is compared with
        self.live = not turns  # a request differed, or the log ran out: no more replay
        self.replayed = 0
        self.masked = 0
        self.divergences: list[dict[str, Any]] = []
        self.unrecorded: dict[str, Any] | None = None  # the divergence the next turn notes

    def take(self, prepared: Prepared, decode: Any) -> dict[str, Any] | None:
        """The logged turn that answers this call, or None: from now on every call is live
        (`decode(ids) -> text`, the tokenizer's, is used only when the ids differ)."""
        if self.live:
            return None
        if self.next >= len(self.turns):
            self.live = True  # the log ran out: the call in flight at the loss, and what follows
            return None
        turn = self.turns[self.next]
        extra = turn.get("extra") or {}
        logged = list(extra.get("delta_ids" if extra.get("merged") else "prompt_ids") or [])
        why = _differs(prepared, extra, logged)
        masked = False
        if why == "prompt_differs" and self._masked_equal(prepared.ids, logged, extra.get("workspace"), decode):
            why, masked = None, True
        if why is not None:
            self._diverged(turn, why, prepared, logged, decode)
            return None
        self.next += 1
        self.replayed += 1
        self.masked += masked
        return {**turn, "masked": masked}

    def _masked_equal(self, ids: list[int], logged: list[int], then: str | None, decode: Any) -> bool:
        """Whether the two prompts say the same but for the attempts' workspace paths."""
        now = self.workspace
        if not (now and then and now != then):
            return False
        return decode(ids).replace(now, then) == decode(logged)

    def _diverged(self, turn: dict[str, Any], why: str, prepared: Prepared, logged: list[int], decode: Any) -> None:
        first = next(
            (i for i, (a, b) in enumerate(zip(prepared.ids, logged)) if a != b), min(len(prepared.ids), len(logged))
        )
        found = {
            "call": turn["index"],
            "logged_attempt": turn.get("attempt"),
            "reason": why,
            "first_token": first,
            "logged": decode(logged[first : first + 64])[:EXCERPT],
            "requested": decode(list(prepared.ids[first : first + 64]))[:EXCERPT],
        }
        self.divergences.append(found)
        self.unrecorded = found
        self.live = True

    def on_turn(self, logged: dict[str, Any] | None) -> dict[str, Any]:
        """What the turn being logged notes of the replay: where a replayed call came from, or
        the divergence a live call is the first after (once)."""
        if logged is not None:
            noted: dict[str, Any] = {"replayed_from_attempt": logged.get("attempt")}
            if logged.get("masked"):
                noted["replay_masked"] = ["workspace"]
            return noted
        found, self.unrecorded = self.unrecorded, None
        return {"replay_divergence": found} if found else {}

    def metrics(self) -> dict[str, Any]:
        """What the rollout's `metrics` say of the replay."""
        return {
            "replayed_calls": self.replayed,
            "replay_masked_calls": self.masked,
            "replay_divergences": list(self.divergences),
            "replay_logged_calls": len(self.turns),
        }


def _differs(prepared: Prepared, extra: dict[str, Any], logged: list[int]) -> str | None:
    """Why the prepared call is not the logged one (None: the same prompt)."""
    if extra.get("sample") != prepared.sample or bool(extra.get("merged")) != prepared.merged:
        return "sample_differs"  # a split where the logged call merged, or the reverse
    if list(prepared.ids) != logged:
        return "prompt_differs"
    return None


def logged_generation(builder: Any, turn: dict[str, Any]) -> Generation:
    """The logged turn's generation appended to `builder` verbatim, as the session appends a
    sampled one (its context limit first: the server's, learnt before it was generated)."""
    extra = turn.get("extra") or {}
    if extra.get("context_length"):
        builder.limit_context(int(extra["context_length"]))
    ids = list(turn.get("generated_ids") or [])
    logprobs = turn.get("logprobs")
    logprobs = list(logprobs) if logprobs or not ids else None
    weight_version = turn.get("weight_version")
    text = builder.add_generation(ids, logprobs, turn.get("finish_reason"), weight_version)
    return Generation(
        token_ids=ids,
        logprobs=logprobs if logprobs is not None else [0.0] * len(ids),
        finish_reason=turn.get("finish_reason"),
        text=text,
        server=turn.get("llm_server"),
        weight_version=weight_version,
        logprobs_mode=extra.get("logprobs_mode"),
        stop_reason=extra.get("stop_sequence"),
    )


def logged_call_ids(turn: dict[str, Any]) -> list[str]:
    """The tool-call ids the logged reply returned (the harness echoes them)."""
    return list((turn.get("extra") or {}).get("tool_call_ids") or [])
