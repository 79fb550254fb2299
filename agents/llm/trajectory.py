"""Token-exact trajectory builder: generated ids verbatim, new messages as template deltas.

The model's output is never decoded and re-encoded. The prompt is the chat template of the
first messages; each generated token is appended as sampled (mask 1, its logprob); each batch
of new messages (tool observations, a user turn) is rendered as the template delta after the
last assistant turn and tokenized alone (mask 0, logprob 0.0).

The seam: the model stops at its end-of-turn token but the template renders e.g.
`<|im_end|>\\n` and may rewrite earlier turns (Qwen3 drops old `<think>` blocks). So the delta
is located on a probe render in which the last assistant content is a sentinel: everything the
template writes after that turn's end token is the delta. A turn that stopped without an end
token (cut on length) gets the template's closing text, end token included, at the head of its
delta. A turn that stopped on *any* end-of-turn token (`<|im_end|>`, Qwen's `<|endoftext|>`,
Llama 3.1's `<|eot_id|>` or `<|eom_id|>`) keeps that token, and the template's own closing
token is left out of the delta: inserting `<|eot_id|>` after a sampled `<|eom_id|>` would be
a sequence the template never produces.

Message text is data, never structure: a tool that prints `<|im_end|>\n<|im_start|>user`
must not forge a turn. Every non-assistant message's content is located in the rendered text
and encoded so that a control token's text inside it stays plain text; only the template's own
delimiters become control ids (`ChatTokenizer.encode_untrusted`). The number of such strings
in observations is reported by the drift audit (`forged_control_tokens`).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import orjson
from raas_client.models import Trajectory

from agents.llm.drift import align_drift
from agents.llm.tokenizer import SENTINEL, ChatTokenizer
from core.errors import RaasError

log = logging.getLogger(__name__)


class TrajectoryError(RaasError, ValueError):
    """The builder was driven out of order (e.g. two appends without a generation between)."""

    code = "trajectory_error"


class TrajectoryBuilder:
    """Grows one Trajectory turn by turn, bounded by the context length `max_model_len`.

    The trajectory is the rollout's record type (`raas_client.models.Trajectory`, the wire's):
    what the builder fills in is what the stages store and the trainer parses, in the same
    class. Each turn's [start, end) and each message's token count go to its `extra`
    (`turn_boundaries`, `message_token_counts`), where the wire has always carried them.

    `max_model_len` is the effective context: the job's, lowered by the session to what the
    server reports (`limit_context`). A delta that does not fit ends the conversation
    (`exhausted`, finish reason `context`); nothing is ever truncated into the trajectory.
    """

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
        self.forged_control_tokens = 0  # control-token texts in appended observations
        # A delta rendered from the conversation's head only, not yet checked against the
        # whole conversation's render (`add_messages(speculate=True)`, `check_delta`).
        self._unchecked: _Unchecked | None = None
        self.last_delta: list[int] = []  # the ids the last `add_messages` appended
        self.redone_deltas = 0  # head-only deltas the whole render disagreed with
        self._shapes: dict[bytes, str | None] = {}  # new messages' shape -> its delta (`_head_delta`)

    def limit_context(self, max_model_len: int) -> None:
        """Lower the context length (a server serves less than the job asked for)."""
        self.max_model_len = min(self.max_model_len, max_model_len)
        if self.traj is not None and self.length >= self.max_model_len:
            self.exhausted = True
            self.traj.finish_reason = "context"

    def _render(self, messages: list[dict], add_generation_prompt: bool, with_tools: bool = True) -> str:
        tools = self.tools if with_tools else None
        return self.tok.render(messages, tools, add_generation_prompt, **self.template_kwargs)

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
        prompts = self.tok.prompts
        key = prompts.key(self.tok.template, list(messages), self.tools, self.template_kwargs)
        cached = prompts.get(key) if key is not None else None
        if cached is not None:
            messages, prompt, counts = cached
        else:
            messages, text, spans = self._render_untrusted(
                list(messages), lambda ms: self._render(ms, add_generation_prompt=True)
            )
            prompt = self.tok.encode_untrusted(text, spans)
            counts = self._prompt_counts(list(messages), prompt)
            if key is not None:
                prompts.put(key, messages, prompt, counts)
        self.traj = Trajectory.build(
            prompt_ids=prompt,
            response_ids=[],
            response_logprobs=[],
            loss_mask=[],
            policy_versions=[],
            token_exact=self.token_exact,
            messages=[dict(m) for m in messages],
            extra={"turn_boundaries": [], "message_token_counts": counts},
        )
        self.exhausted = len(prompt) >= self.max_model_len
        if self.exhausted:
            self.traj.finish_reason = "context"
        return prompt

    def add_generation(
        self,
        token_ids: list[int],
        logprobs: list[float] | None,
        finish_reason: str | None,
        weight_version: str | None,
    ) -> str:
        """Append one generated turn verbatim (mask 1) and return its decoded text."""
        traj = self._require()
        if traj.messages[-1].get("role") == "assistant":
            raise TrajectoryError("two generations in a row: append the observations first")
        if self._unchecked is not None:  # it may yet be redone: the turn would follow other ids
            raise TrajectoryError("a generation after an unchecked delta: check_delta() first")
        logprobs = list(logprobs) if logprobs is not None else [0.0] * len(token_ids)
        if len(logprobs) != len(token_ids):
            raise TrajectoryError(f"{len(token_ids)} tokens but {len(logprobs)} logprobs")
        start = len(traj.response_ids)
        traj.response_ids += token_ids
        traj.response_logprobs += [float(x) for x in logprobs]
        traj.loss_mask += [1] * len(token_ids)
        traj.extra["turn_boundaries"].append([start, len(traj.response_ids)])
        traj.policy_versions.append(weight_version)
        traj.finish_reason = finish_reason
        self._last_ended = bool(token_ids) and token_ids[-1] in self.tok.end_ids
        text = self.tok.decode(token_ids)
        traj.messages.append({"role": "assistant", "content": text})
        traj.extra["message_token_counts"].append(len(token_ids))
        return text

    def add_messages(self, messages: list[dict], speculate: bool = False) -> list[int]:
        """Append new messages as the template delta (mask 0); [] if the context is exhausted.

        `speculate`: render the delta after the conversation's head alone (its system and
        first user message), not after all of it: the render then costs the same at turn 50 as
        at turn 2. Every template this was tried with writes the same delta either way, but
        nothing promises it, so the delta is unchecked until `check_delta` compares it with the
        whole conversation's render; the caller sends the prompt first and checks while the
        server works on it (`http11.while_server_works`), and asks again if it was redone.
        """
        traj = self._require()
        self.check_delta()  # an earlier unchecked delta is settled before anything is added
        self.last_delta = []
        if not messages or self.exhausted:
            return []
        if traj.messages[-1].get("role") != "assistant":
            raise TrajectoryError("append_messages twice without a generation: pass all of a turn's messages at once")
        forged = sum(
            len(self.tok.control_texts_in(str(m.get("content") or "")))
            for m in messages
            if m.get("role") != "assistant"
        )
        head = self._speculation_head() if speculate and not forged else None  # spans need the whole render
        mark = _Mark.of(traj, self.forged_control_tokens)
        shaped = False
        if head is None:
            messages, text, spans = self._render_untrusted(list(messages), self.delta_text)
        else:
            messages, spans = list(messages), []
            text, shaped = self._head_delta(messages, head)
        delta = self.tok.encode_untrusted(text, spans)
        if self.length + len(delta) >= self.max_model_len:  # no room left to generate after it
            if head is not None:
                return self.add_messages(messages)  # the whole render decides whether it fits
            traj.finish_reason, self.exhausted = "context", True
            return []
        self.forged_control_tokens += forged
        traj.response_ids += delta
        traj.response_logprobs += [0.0] * len(delta)
        traj.loss_mask += [0] * len(delta)
        traj.messages += [dict(m) for m in messages]
        traj.extra["message_token_counts"] += self._delta_counts(messages, text, delta)
        self.last_delta = delta
        if head is not None:
            self._unchecked = _Unchecked(messages, text, mark, shaped)
        return delta

    def _head_delta(self, messages: list[dict], head: int) -> tuple[str, bool]:
        """The head-only delta of `messages`, and whether it came from their shape's render: the
        same messages with each field's text a mark, rendered once per shape (a rollout's tool
        results mostly share one) and filled in with this call's texts in one pass."""
        if not self.tok.shaped_deltas:
            return self.delta_text(messages, head), False
        values: list[str] = []

        def mark(value: str) -> str:
            values.append(value)
            return FIELD_MARK.format(len(values) - 1)

        shape = [{k: mark(v) if isinstance(v, str) and k != "role" else v for k, v in m.items()} for m in messages]
        try:
            key = orjson.dumps([shape, self._last_ended], option=orjson.OPT_SORT_KEYS)
        except TypeError:  # a value JSON cannot hold: no shape to key it by
            return self.delta_text(messages, head), False
        if key not in self._shapes:
            if len(self._shapes) >= MAX_SHAPES:
                self._shapes.clear()
            text = self.delta_text(shape, head)
            # usable only if the template wrote each text once, as it was (not escaped, not cut)
            whole = all(text.count(FIELD_MARK.format(i)) == 1 for i in range(len(values)))
            self._shapes[key] = text if whole else None
        cached = self._shapes[key]
        if cached is None:
            return self.delta_text(messages, head), False
        return _FIELD_MARK.sub(lambda found: values[int(found.group(1))], cached), True

    def _speculation_head(self) -> int | None:
        """How many of the conversation's first messages a head-only delta render keeps (up to
        its first non-system message); None when that is no shorter than the whole."""
        history = self._require().messages
        head = next((i + 1 for i, m in enumerate(history) if m.get("role") not in ("system", "developer")), None)
        if head is None or head >= len(history) - 1 or not self.tok.speculative_deltas:
            return None
        return head

    def check_delta(self) -> bool:
        """Settle the unchecked delta (`add_messages(speculate=True)`): True if there is none or
        the whole conversation's render writes the same text; else it is taken back, appended
        again from the whole render, and False (a prompt sent with it must be sent again).
        After one such miss a template's deltas are no longer rendered head-only. A whole
        render that raises takes the delta back and raises, as appending it would have."""
        unchecked, self._unchecked = self._unchecked, None
        if unchecked is None:
            return True
        try:
            if self.delta_text(unchecked.messages, upto=unchecked.mark.messages) == unchecked.text:
                return True
        except Exception:  # the whole render fails (a budget, the template's own error): as
            unchecked.mark.restore(self._require(), self)  # if it had failed when appending
            raise
        self.redone_deltas += 1
        if unchecked.shaped:  # the template's texts are not written as they are: render them
            self.tok.shaped_deltas = False
            log.info("a template delta filled in from its shape differed from the whole render: no longer filled in")
        else:
            self.tok.speculative_deltas = False
            log.info("a head-only template delta differed from the whole render: rendered whole from now on")
        unchecked.mark.restore(self._require(), self)
        self.add_messages(unchecked.messages)
        return False

    def _render_untrusted(self, messages: list[dict], render) -> tuple[list[dict], str, list[tuple[int, int]]]:
        """(messages, `render(messages)`, the character spans of their non-assistant contents).

        The spans come from a second render with a unique mark in place of each such content:
        the real text must be that render with the marks replaced, else (a template that
        rewrites message text) the messages are returned with every control-token text broken
        by a word joiner, which no longer needs spans to be safe.
        """
        text = render(messages)
        if not any(
            self.tok.control_texts_in(m["content"])
            for m in messages
            if m.get("role") != "assistant" and isinstance(m.get("content"), str)
        ):
            # No control-token text in any message: spans (or defusing) change nothing, so
            # the probe render that locates them is skipped (one render per turn saved).
            return messages, text, []
        spans = self._spans(messages, render, text)
        if spans is not None:
            return messages, text, spans
        defused = [
            m
            if m.get("role") == "assistant" or not isinstance(m.get("content"), str)
            else {**m, "content": self._defuse(m["content"])}
            for m in messages
        ]
        return defused, render(defused), []

    @staticmethod
    def _spans(messages: list[dict], render, text: str) -> list[tuple[int, int]] | None:
        marks: dict[str, str] = {}
        probe = []
        for i, message in enumerate(messages):
            content = message.get("content")
            if message.get("role") != "assistant" and isinstance(content, str) and content:
                mark = f"\x00raas-message-{i}\x00"
                marks[mark] = content
                message = {**message, "content": mark}
            probe.append(message)
        if not marks:
            return []
        rendered, spans, out, at = render(probe), [], [], 0
        for mark, content in marks.items():
            found = rendered.find(mark, at)
            if found < 0:
                return None
            out.append(rendered[at:found])
            start = sum(map(len, out))
            out.append(content)
            spans.append((start, start + len(content)))
            at = found + len(mark)
        out.append(rendered[at:])
        return spans if "".join(out) == text else None

    def _defuse(self, text: str) -> str:
        for start, _end in reversed(self.tok.control_texts_in(text)):
            text = text[: start + 1] + "\u2060" + text[start + 1 :]
        return text

    def _prompt_counts(self, messages: list[dict], prompt: list[int]) -> list[int]:
        """Split the prompt's ids between its messages (the last one takes the generation
        prompt): message k ends where the template of `messages[:k+1]` ends."""
        full = self._render(messages, add_generation_prompt=True)
        cuts = []
        for k in range(1, len(messages)):
            head = self._render(messages[:k], add_generation_prompt=False)
            cuts.append(len(head) if full.startswith(head) else None)
        return self.tok.split_counts(full, prompt, cuts)

    def _delta_counts(self, messages: list[dict], text: str, delta: list[int]) -> list[int]:
        """Split one delta between the messages it renders (by where each one's text starts)."""
        cuts, at = [], 0
        for message in messages[1:]:
            content = str(message.get("content") or "")
            found = text.find(content, at) if content else -1
            cuts.append(found if found >= 0 else None)
            at = max(at, found)
        return self.tok.split_counts(text, delta, cuts)

    def delta_text(self, new_messages: list[dict], head: int | None = None, upto: int | None = None) -> str:
        """Text the template writes after the last generated turn, up to the next generation
        (`head`: rendered after the conversation's first `head` messages only; `upto`: the
        conversation as it was with that many messages)."""
        history = self._require().messages[:upto]
        kept = history[:-1] if head is None else history[:head]
        probe = kept + [{"role": "assistant", "content": SENTINEL}] + list(new_messages)
        # A head-only render leaves the tool schemas out too: the templates tried write them
        # before the first user message, never after an assistant turn (the check says if not).
        rendered = self._render(probe, add_generation_prompt=True, with_tools=head is None)
        after = rendered[rendered.index(SENTINEL) + len(SENTINEL) :]
        if not self._last_ended:
            return after  # cut on length: the template's closing text belongs to the delta
        # The sampled end token stands for the template's closing end token (whichever it was).
        close = self.tok.end_text_at(after)
        return after[close[1] :] if close is not None else after

    def reference_ids(self) -> list[int]:
        """Ids of a full re-render of the conversation, cut where the trajectory stops."""
        traj = self.trajectory()
        last_is_assistant = traj.messages[-1].get("role") == "assistant"
        _, text, spans = self._render_untrusted(
            traj.messages, lambda ms: self._render(ms, add_generation_prompt=not last_is_assistant)
        )
        if last_is_assistant:
            # Compare only up to where the model stopped; the template's close is not sampled,
            # except its end token when the model did sample one.
            tail = self.tok.close_text
            if tail and text.endswith(tail):
                text = text[: len(text) - len(tail)]
                close = self.tok.end_text_at(tail)
                if self._last_ended and close is not None:
                    text += tail[: close[1]]
        return self.tok.encode_untrusted(text, spans)

    def audit_drift(self) -> dict[str, Any]:
        """Compare with a full re-render; report, never edit (see `agents.llm.drift`)."""
        traj = self.trajectory()
        report = align_drift(
            traj.prompt_ids + traj.response_ids, self.reference_ids(), len(traj.prompt_ids), traj.turn_boundaries
        )
        report["forged_control_tokens"] = self.forged_control_tokens  # kept as plain text
        return report

    def trajectory(self) -> Trajectory:
        """The trajectory so far (a live object: copy it before mutating); an unchecked delta
        is settled first (`check_delta`)."""
        self.check_delta()
        return self._require()

    def sequence(self) -> list[int]:
        """Prompt and response ids as they stand, an unchecked delta included: what a
        generation request sends (`check_delta` settles it while the server works)."""
        traj = self._require()
        return traj.prompt_ids + traj.response_ids


@dataclass(frozen=True)
class _Mark:
    """How long a trajectory's arrays were before a delta was appended (to take it back)."""

    ids: int
    messages: int
    counts: int
    forged: int
    finish_reason: str | None

    @classmethod
    def of(cls, traj: Trajectory, forged: int) -> _Mark:
        return cls(
            len(traj.response_ids),
            len(traj.messages),
            len(traj.extra["message_token_counts"]),
            forged,
            traj.finish_reason,
        )

    def restore(self, traj: Trajectory, builder: TrajectoryBuilder) -> None:
        del traj.response_ids[self.ids :], traj.response_logprobs[self.ids :], traj.loss_mask[self.ids :]
        del traj.messages[self.messages :], traj.extra["message_token_counts"][self.counts :]
        traj.finish_reason, builder.forged_control_tokens = self.finish_reason, self.forged
        builder.last_delta = []


@dataclass(frozen=True)
class _Unchecked:
    """A head-only delta awaiting `TrajectoryBuilder.check_delta`."""

    messages: list[dict]
    text: str
    mark: _Mark
    shaped: bool  # filled in from its shape's render (`TrajectoryBuilder._head_delta`)


MAX_SHAPES = 64  # message shapes a builder keeps the delta of
FIELD_MARK = "\x00raas-field-{}\x00"  # stands for a message's text in its shape's render
_FIELD_MARK = re.compile("\x00raas-field-([0-9]+)\x00")
