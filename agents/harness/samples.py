"""Merge a harness's calls into prefix-consistent samples, or split when it rewrites history.

Pure (no HTTP, no server): it owns the rollout's `TrajectoryBuilder`s. A call whose messages
are the previous call's messages + the assistant reply raas returned + new messages is a
*merge*: only the new messages are rendered, as the template delta (mask 0), after the
generated ids kept verbatim; that is what keeps the sample token-exact. Any other call
(history dropped, truncated or summarised, the system prompt or the tools changed, an
assistant message edited) starts a new sample from a full render: a *split*. The rollout's
training data is then its samples in order, each one prefix-consistent.

The comparison tolerates exactly the normalisations an SDK makes when it echoes a reply
(`agents.harness.messages.canonical`) and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from agents.harness.messages import canonical, key, template_message
from agents.llm.trajectory import Trajectory, TrajectoryBuilder


@dataclass
class Prepared:
    """How a call's prompt was made: `ids` are the prompt (a new sample) or the delta (a merge)."""

    sample: int  # index of the sample the call generates into
    merged: bool
    split_reason: str | None
    ids: list[int]
    fits: bool  # False: the prompt leaves no room to generate (context exceeded)
    prompt_tokens: int  # what the server will see: the whole sequence so far


@dataclass
class Sample:
    """One prefix-consistent training sequence and how it came to be."""

    builder: TrajectoryBuilder
    split_reason: str | None = None  # why the previous sample ended (None for the first)
    calls: int = 0  # generations in it

    @property
    def trajectory(self) -> Trajectory:
        """Its token arrays."""
        return self.builder.trajectory()


@dataclass
class SampleTracker:
    """The rollout's samples; `prepare` readies the current builder for one call."""

    new_builder: Callable[[], TrajectoryBuilder]
    samples: list[Sample] = field(default_factory=list)
    merges: int = 0
    splits: int = 0
    split_reasons: dict[str, int] = field(default_factory=dict)
    _expected: list[dict] | None = None  # the last request + the reply returned (canonical)
    _tools: list[dict] | None = None  # the tools of the current sample
    _pending_tools: list[dict] | None = None
    _pending: list[dict] | None = None  # a prepared call that did not generate (canonical)
    _prepared: Prepared | None = None  # how that call was prepared (a retry reuses it)
    _generated: dict[str, str] = field(default_factory=dict)  # reply key -> model's text
    # Merges render their delta head-only, checked while the server generates
    # (`TrajectoryBuilder.add_messages(speculate=True)`; `confirmed` after the generation).
    speculate: bool = False

    @property
    def current(self) -> Sample | None:
        """The sample the next merge would extend."""
        return self.samples[-1] if self.samples else None

    def prepare(self, messages: list[dict[str, Any]], tools: list[dict] | None) -> Prepared:
        """Make the current builder ready to generate the answer to `messages`."""
        keys = [canonical(m) for m in messages]
        tools_key = tools or None
        sample = self.current
        if sample is not None and self._pending is not None:
            if keys == self._pending and tools_key == self._pending_tools and self._prepared:
                return self._prepared  # the same call again (the harness retried it)
            if sample.calls == 0:
                self.samples.pop()  # nothing generated in it: not a sample
                sample, self._pending = self.current, None
        reason = self._why_not_extended(keys, tools_key) if sample is not None else None
        if sample is not None and reason is None and self._pending is None:
            return self._merge(sample, messages[len(self._expected or []) :], keys)
        return self._start(messages, tools, tools_key, keys, reason)

    def _why_not_extended(self, keys: list[dict], tools_key: list[dict] | None) -> str | None:
        """None if `keys` extend the last request + reply, else the split reason."""
        expected = self._expected or []
        if self._pending is not None:
            return "rewritten_after_failed_call"
        if tools_key != self._tools:
            return "tools_changed"
        if len(keys) > len(expected) and keys[: len(expected)] == expected:
            return None
        first = next((i for i, (a, b) in enumerate(zip(keys, expected)) if a != b), None)
        if first is None:
            return "history_not_extended"  # a repeat or a truncation at the end
        old, new = expected[first], keys[first]
        if old["role"] == new["role"] == "system":
            return "system_changed"
        if keys[first] in expected[first + 1 :]:
            return "messages_dropped"  # what followed moved up: something was left out
        if old["role"] == new["role"] == "assistant":
            return "assistant_edited"
        return "history_rewritten"  # dropped, summarised or edited earlier messages

    def _merge(self, sample: Sample, new: list[dict[str, Any]], keys: list[dict]) -> Prepared:
        rendered = [template_message(m, self._generated) for m in new]
        before = sample.builder.length
        delta = sample.builder.add_messages(rendered, speculate=self.speculate)
        if not delta or sample.builder.exhausted:
            # Nothing was appended: the sample still ends on its last reply.
            return Prepared(len(self.samples) - 1, True, None, [], False, before)
        self._pending, self._pending_tools = keys, self._tools
        return self._ready(sample, True, None, delta)

    def _start(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict] | None,
        tools_key: list[dict] | None,
        keys: list[dict],
        reason: str | None,
    ) -> Prepared:
        builder = self.new_builder()
        prompt = builder.start([template_message(m, self._generated) for m in messages], tools)
        sample = Sample(builder, split_reason=reason)
        self.samples.append(sample)
        self._pending, self._pending_tools = keys, tools_key
        return self._ready(sample, False, reason, prompt)

    def _ready(self, sample: Sample, merged: bool, reason: str | None, ids: list[int]) -> Prepared:
        fits = not sample.builder.exhausted and sample.builder.budget_left > 0
        self._prepared = Prepared(len(self.samples) - 1, merged, reason, ids, fits, sample.builder.length)
        return self._prepared

    def confirmed(self, prepared: Prepared) -> Prepared:
        """`prepared` as it was generated from: a merge whose head-only delta the whole render
        redid (`TrajectoryBuilder.check_delta`) went to the server with the redone ids."""
        builder = self.samples[prepared.sample].builder
        if not prepared.merged or builder.last_delta is prepared.ids:
            return prepared
        ids = builder.last_delta
        prompt_tokens = prepared.prompt_tokens - len(prepared.ids) + len(ids)
        confirmed = replace(prepared, ids=ids, fits=prepared.fits and bool(ids), prompt_tokens=prompt_tokens)
        if ids:
            self._prepared = confirmed
        else:  # the delta is not in the sample (it did not fit, or its render failed): a
            self._pending = self._prepared = None  # retry of the call prepares it afresh
        return confirmed

    def count_prompt(self, messages: list[dict[str, Any]], tools: list[dict] | None) -> int:
        """How many tokens a fresh render of `messages` (and `tools`) is, replies raas
        generated rendered from the model's own text; no sample changes."""
        builder = self.new_builder()
        return len(builder.start([template_message(m, self._generated) for m in messages], tools))

    def generated(self, reply: dict[str, Any], text: str) -> None:
        """The current call's reply: `reply` as returned to the harness (OpenAI form), `text`
        what the model generated for it. The next call must extend request + reply to merge."""
        sample = self.samples[-1]
        if self._prepared is not None and self._prepared.merged:
            self.merges += 1
        elif sample.calls == 0 and sample.split_reason is not None:
            # Counted once the new sample holds a generation: a rewritten call that failed
            # (no room, no server) and was rewritten again is one split, not two.
            self.splits += 1
            reasons = self.split_reasons
            reasons[sample.split_reason] = reasons.get(sample.split_reason, 0) + 1
        self._generated[key(reply)] = text
        self._expected = (self._pending or []) + [canonical(reply)]
        self._tools = self._pending_tools
        self._pending = self._prepared = None
        sample.calls += 1

    def training_samples(self) -> list[Sample]:
        """The samples that hold at least one generation, in order."""
        return [s for s in self.samples if s.calls]

    @staticmethod
    def describe(message: dict[str, Any]) -> dict[str, Any]:
        """The canonical form of a message (for logs and tests)."""
        return canonical(message)
