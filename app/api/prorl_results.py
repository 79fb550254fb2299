"""A finished rollout in ProRL's `/process` result shape.

Every message carries `token_ids`: system and user messages their slice of the prompt, each
observation the template delta it added, each assistant message the ids it generated (plus the
exact input of that call, `input_ids`, and its `logprobs`). Concatenated they are the rollout's
`prompt_ids + response_ids`, which is what NeMo RL's converter rebuilds. As in ProRL, the list
ends with an assistant message: trailing observations (mask 0, never trained on) are dropped
from the messages and from the returned token arrays alike.

A harness rollout whose history was rewritten has several samples (`extra["samples"]`): the
result is its last sample, as above, and `samples` lists every one (the last one included)
with its arrays and `split_reason`; each trains with the result's reward.
"""

from __future__ import annotations

import json
from typing import Any

from core.models import Rollout, Turn

# Finish reasons that mean the episode was cut by a length limit (ProRL's `end_properly=False`).
LENGTH_REASONS = {"length", "context", "token_budget", "turn_length"}


def prorl_result(
    r: Rollout, turns: list[Turn], request_instance: dict[str, Any], instance_id: str, wall_seconds: float | None = None
) -> dict[str, Any]:
    """The ProRL result of rollout `r` for the instance the client sent."""
    extra = r.extra or {}
    outcome = r.outcome or ""
    samples = extra.get("samples") or []
    if samples:  # the arrays and messages are the last sample's: so are its turns
        turns = [t for t in turns if (t.extra or {}).get("sample") == len(samples) - 1]
    messages, response = prorl_messages(r, turns)
    success = outcome == "completed"
    critical = critical_error(r)
    reward = r.reward
    return {
        "instance_id": instance_id,
        "trajectory_id": request_instance.get("trajectory_id", r.id),
        "messages": messages,
        "tools": extra.get("tools") or [],
        "success": success,
        "error": None if success else r.error,
        "finish": r.finish_reason == "finish",
        "finish_reason": r.finish_reason,
        "end_properly": success and r.finish_reason not in LENGTH_REASONS,
        "resolved": bool(reward is not None and reward > 0.99),
        "reward": reward,
        "score": float(reward or 0.0),
        "critical_error": critical,
        "filter": critical is not None or not success,
        "git_patch": extra.get("git_patch"),
        "timing": timing(r, wall_seconds),
        "prompt_ids": r.prompt_ids or [],
        **response,
        **({"samples": [_sample(x) for x in samples]} if samples else {}),
        "outcome": outcome,
        "rollout_id": r.id,
    }


def _sample(sample: dict[str, Any]) -> dict[str, Any]:
    """One training sample of a split harness rollout, in the result's own key names."""
    keys = ("prompt_ids", "response_ids", "response_logprobs", "loss_mask", "split_reason")
    return {k: sample.get(k) for k in keys}


def critical_error(r: Rollout) -> str | None:
    """ProRL's critical_error: the stage of an infrastructure failure, "timeout" for a
    deadline or a cancel (ProRL marks cancelled jobs timed out), else None."""
    if r.outcome in ("timeout", "cancelled"):
        return "timeout"
    if r.outcome == "infra_error":
        stage = (r.error or "").split(":", 1)[0].strip()
        return stage if stage in ("init", "run", "eval") else "run"
    return None


def timing(r: Rollout, wall_seconds: float | None) -> dict[str, Any]:
    """ProRL's timing keys: per-stage seconds, the rest (queues) as others_time."""
    stages = [r.init_seconds or 0.0, r.run_seconds or 0.0, r.eval_seconds or 0.0]
    counted = sum(stages)
    others = max(0.0, wall_seconds - counted) if wall_seconds is not None else 0.0
    return {
        "init_time": stages[0],
        "run_time": stages[1],
        "eval_time": stages[2],
        "others_time": round(others, 4),
        "counted_elapsed": counted,
        "timeout_triggered": r.outcome == "timeout",
    }


def prorl_messages(r: Rollout, turns: list[Turn]) -> tuple[list[dict[str, Any]], dict]:
    """Messages with their token slices, and the response arrays they concatenate to."""
    stored = list(r.messages or [])
    prompt, response = list(r.prompt_ids or []), list(r.response_ids or [])
    counts = _counts(r, turns, stored, len(prompt) + len(response))
    seq, out, at, k = prompt + response, [], 0, 0
    for message, n in zip(stored, counts, strict=True):
        item = {"role": message.get("role"), "content": _content(message), "token_ids": seq[at : at + n]}
        if message.get("role") == "assistant":
            turn = turns[k] if k < len(turns) else None
            item.update(
                input_ids=seq[:at],
                logprobs=list((turn and turn.logprobs) or []),
                tool_calls=[_flat_call(c) for c in (turn and turn.tool_calls) or []],
            )
            k += 1
        elif message.get("name"):
            item["name"] = message["name"]
        out.append(item)
        at += n
    while out and out[-1]["role"] != "assistant":  # ProRL ends on the model's last turn
        out.pop()
    kept = sum(len(m["token_ids"]) for m in out) - len(prompt) if out else 0
    kept = max(0, kept)
    return out, {
        "response_ids": response[:kept],
        "response_logprobs": list(r.response_logprobs or [])[:kept],
        "loss_mask": list(r.loss_mask or [])[:kept],
    }


def _counts(r: Rollout, turns: list[Turn], stored: list[dict], total: int) -> list[int]:
    """Tokens per message: the builder's record, else rebuilt from the turn log."""
    recorded = (r.extra or {}).get("message_token_counts")
    if isinstance(recorded, list) and len(recorded) == len(stored) and sum(recorded) == total:
        return [int(n) for n in recorded]
    counts, k, first_after = [], 0, False
    n_prompt = next((i for i, m in enumerate(stored) if m.get("role") == "assistant"), len(stored))
    for i, message in enumerate(stored):
        if i < n_prompt:
            counts.append(len(r.prompt_ids or []) if i == n_prompt - 1 else 0)
        elif message.get("role") == "assistant":
            turn = turns[k] if k < len(turns) else None
            counts.append(len((turn and turn.generated_ids) or []))
            first_after, k = True, k + 1
        else:  # the whole delta after a turn goes to the first message it rendered
            turn = turns[k - 1] if 0 < k <= len(turns) else None
            counts.append(len((turn and turn.observation_ids) or []) if first_after else 0)
            first_after = False
    if sum(counts) != total:  # the log disagrees with the arrays: put any rest on the last one
        counts[-1:] = [max(0, counts[-1] + total - sum(counts))] if counts else []
    return counts


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # multi-part content: its text parts, as ProRL flattens it
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _flat_call(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call as ProRL flattens it: {name, arguments} with arguments as a JSON string."""
    arguments = call.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {})
    return {"name": call.get("name"), "arguments": arguments}
