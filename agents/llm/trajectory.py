"""Token-exact trajectory builder: generated ids verbatim, new messages as template deltas.

The model's output is never decoded and re-encoded. The prompt is the chat template of the
first messages; each generated token is appended as sampled (mask 1, its logprob); each batch
of new messages (tool observations, a user turn) is rendered as the template delta after the
last assistant turn and tokenized alone (mask 0, logprob 0.0).

The seam: the model stops at its end-of-turn token but the template renders e.g.
`<|im_end|>\\n` and may rewrite earlier turns (Qwen3 drops old `<think>` blocks). So the delta
is located on a probe render in which the last assistant content is a sentinel: everything the
template writes after that turn's end token is the delta. A turn that stopped without an end
token (length) gets the template's closing text, end token included, at the head of its delta.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from agents.llm.tokenizer import ChatTokenizer
from app.errors import RaasError

SENTINEL = "\x00raas-assistant-turn\x00"


class TrajectoryError(RaasError, ValueError):
    """The builder was driven out of order (e.g. two appends without a generation between)."""

    code = "trajectory_error"


@dataclass
class Trajectory:
    """A rollout's token arrays; `loss_mask` and `response_logprobs` align with `response_ids`."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turn_boundaries: list[list[int]] = field(default_factory=list)  # [start, end) of each turn
    finish_reason: str | None = None
    weight_versions: list[str | None] = field(default_factory=list)
    token_exact: bool = True
    messages: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (for the Rollout row and the results API)."""
        return asdict(self)


class TrajectoryBuilder:
    """Grows one Trajectory turn by turn, bounded by `max_model_len`."""

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        max_model_len: int,
        template_kwargs: dict[str, Any] | None = None,
        token_exact: bool = True,
    ) -> None:
        self.tok = tokenizer
        self.max_model_len = max_model_len
        self.template_kwargs = dict(template_kwargs or {})
        self.tools: list[dict] | None = None
        self.traj: Trajectory | None = None
        self.token_exact = token_exact
        self._last_ended = True  # did the last generated turn end with an end-of-turn token?
        self.exhausted = False  # a delta did not fit: the conversation cannot go on

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tok.render(messages, self.tools, add_generation_prompt, **self.template_kwargs)

    @property
    def messages(self) -> list[dict]:
        """The conversation so far (assistant contents are the decoded generations)."""
        return self._require().messages

    def _require(self) -> Trajectory:
        if self.traj is None:
            raise TrajectoryError("start() the conversation first")
        return self.traj

    @property
    def length(self) -> int:
        """Prompt plus response tokens so far."""
        traj = self._require()
        return len(traj.prompt_ids) + len(traj.response_ids)

    @property
    def budget_left(self) -> int:
        """Tokens left before max_model_len (0 once the context is exhausted)."""
        return 0 if self.exhausted else max(0, self.max_model_len - self.length)

    def start(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """Render the prompt (system + user, with tools) and return its ids."""
        if not messages:
            raise TrajectoryError("the prompt needs at least one message")
        self.tools = tools or None
        prompt = self.tok.encode(self._render(list(messages), add_generation_prompt=True))
        self.traj = Trajectory(
            prompt_ids=prompt, token_exact=self.token_exact, messages=[dict(m) for m in messages]
        )
        self.exhausted = len(prompt) >= self.max_model_len
        if self.exhausted:
            self.traj.finish_reason = "length"
        return prompt

    def add_generation(
        self, token_ids: list[int], logprobs: list[float] | None, finish_reason: str | None,
        weight_version: str | None,
    ) -> str:
        """Append one generated turn verbatim (mask 1) and return its decoded text."""
        traj = self._require()
        if traj.messages[-1].get("role") == "assistant":
            raise TrajectoryError("two generations in a row: append the observations first")
        logprobs = list(logprobs) if logprobs is not None else [0.0] * len(token_ids)
        if len(logprobs) != len(token_ids):
            raise TrajectoryError(f"{len(token_ids)} tokens but {len(logprobs)} logprobs")
        start = len(traj.response_ids)
        traj.response_ids += token_ids
        traj.response_logprobs += [float(x) for x in logprobs]
        traj.loss_mask += [1] * len(token_ids)
        traj.turn_boundaries.append([start, len(traj.response_ids)])
        traj.weight_versions.append(weight_version)
        traj.finish_reason = finish_reason
        self._last_ended = bool(token_ids) and token_ids[-1] in self.tok.end_ids
        text = self.tok.decode(token_ids)
        traj.messages.append({"role": "assistant", "content": text})
        return text

    def add_messages(self, messages: list[dict]) -> list[int]:
        """Append new messages as the template delta (mask 0); [] if the context is exhausted."""
        traj = self._require()
        if not messages or self.exhausted:
            return []
        if traj.messages[-1].get("role") != "assistant":
            raise TrajectoryError(
                "append_messages twice without a generation: pass all of a turn's messages at once"
            )
        delta = self.tok.encode(self.delta_text(messages))
        if self.length + len(delta) > self.max_model_len:
            traj.finish_reason, self.exhausted = "length", True
            return []
        traj.response_ids += delta
        traj.response_logprobs += [0.0] * len(delta)
        traj.loss_mask += [0] * len(delta)
        traj.messages += [dict(m) for m in messages]
        return delta

    def delta_text(self, new_messages: list[dict]) -> str:
        """Text the template writes after the last generated turn, up to the next generation."""
        history = self._require().messages
        probe = history[:-1] + [{"role": "assistant", "content": SENTINEL}] + list(new_messages)
        rendered = self._render(probe, add_generation_prompt=True)
        after = rendered[rendered.index(SENTINEL) + len(SENTINEL):]
        if not self._last_ended:
            return after  # stopped on length: the template's closing text belongs to the delta
        end_text = self.tok.token_text(self._require().response_ids[-1])
        at = after.find(end_text)
        return after[at + len(end_text):] if at >= 0 else after

    def reference_ids(self) -> list[int]:
        """Ids of a full re-render of the conversation, cut where the trajectory stops."""
        traj = self._require()
        last_is_assistant = traj.messages[-1].get("role") == "assistant"
        text = self._render(traj.messages, add_generation_prompt=not last_is_assistant)
        if last_is_assistant:
            # Compare only up to where the model stopped; the template's close is not sampled.
            end_text = self.tok.token_text(traj.response_ids[-1]) if traj.response_ids else ""
            at = text.rfind(end_text) if (self._last_ended and end_text) else -1
            if at >= 0:
                text = text[: at + len(end_text)]
            else:
                text = self._cut_before_close(text)
        return self.tok.encode(text)

    def _cut_before_close(self, text: str) -> str:
        """Drop the closing text the template appends after the last (unfinished) turn."""
        closing = self._render([{"role": "assistant", "content": SENTINEL}], False)
        tail = closing[closing.index(SENTINEL) + len(SENTINEL):]
        return text[: len(text) - len(tail)] if tail and text.endswith(tail) else text

    def audit_drift(self) -> dict[str, Any]:
        """Compare with a full re-render; report, never edit. Positions past the shorter differ."""
        traj = self._require()
        built = traj.prompt_ids + traj.response_ids
        reference = self.reference_ids()
        diffs = [i for i in range(max(len(built), len(reference)))
                 if i >= len(built) or i >= len(reference) or built[i] != reference[i]]
        return {"retokenization_drift": len(diffs), "first_diff": diffs[0] if diffs else None}

    def trajectory(self) -> Trajectory:
        """The trajectory so far (a live object: copy it before mutating)."""
        return self._require()
