"""Merge/split of a harness's calls into samples (pure: no HTTP), with the real SmolLM2
tokenizer and the Qwen-style tool template."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agents.harness.samples import SampleTracker
from agents.llm.tokenizer import load_chat_tokenizer
from agents.llm.trajectory import TrajectoryBuilder
from tests.harness.conftest import BASH_TOOL, QWEN_TEMPLATE, SMOLLM2, ids_of

END = 2  # <|im_end|>
CALL_LS = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>'
CALL_CAT = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "cat a.txt", "n": 1}}\n</tool_call>'
SYSTEM = {"role": "system", "content": "You fix bugs."}
USER = {"role": "user", "content": "Task i-1: fix it."}


@pytest.fixture(params=["qwen", "chatml"])
def tracker(request) -> SampleTracker:
    template = QWEN_TEMPLATE if request.param == "qwen" else None
    tok = load_chat_tokenizer(SMOLLM2, template)
    return SampleTracker(lambda: TrajectoryBuilder(tok, 4096))


def generate(tracker: SampleTracker, text: str, reply: dict[str, Any]) -> list[int]:
    """What the endpoint does after the server answered: append verbatim, note the reply."""
    ids = ids_of(text) + [END]
    builder = tracker.current.builder
    decoded = builder.add_generation(ids, [-0.5] * len(ids), "stop", "v1")
    tracker.generated(reply, decoded)
    return ids


def call(name: str, args: Any, id_: str = "call_1") -> dict[str, Any]:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


def test_three_calls_merge_into_one_token_exact_sample(tracker) -> None:
    first = tracker.prepare([SYSTEM, USER], [BASH_TOOL])
    assert not first.merged and first.split_reason is None and first.fits
    gen1 = generate(
        tracker, CALL_LS, {"role": "assistant", "content": None, "tool_calls": [call("bash", {"cmd": "ls"}, "call_a")]}
    )
    # The SDK echoes: content "" instead of None, its own id, arguments as a JSON string with
    # other spacing and key order.
    echo1 = {"role": "assistant", "content": "", "tool_calls": [call("bash", '{"cmd":"ls"}', "call_zzz")]}
    history = [SYSTEM, USER, echo1, {"role": "tool", "tool_call_id": "call_zzz", "content": "a.txt"}]
    second = tracker.prepare(history, [BASH_TOOL])
    assert second.merged and second.ids and second.fits
    gen2 = generate(
        tracker,
        CALL_CAT,
        {"role": "assistant", "content": None, "tool_calls": [call("bash", {"cmd": "cat a.txt", "n": 1})]},
    )
    echo2 = {
        "role": "assistant",
        "content": None,
        "tool_calls": [call("bash", json.dumps({"n": 1, "cmd": "cat a.txt"}, indent=2))],
    }
    history += [echo2, {"role": "tool", "content": "hello"}]
    third = tracker.prepare(history, [BASH_TOOL])
    assert third.merged
    gen3 = generate(tracker, "Done.", {"role": "assistant", "content": "Done."})

    traj = tracker.current.trajectory
    assert traj.prompt_ids == first.ids
    assert traj.response_ids == gen1 + second.ids + gen2 + third.ids + gen3
    assert traj.loss_mask == (
        [1] * len(gen1) + [0] * len(second.ids) + [1] * len(gen2) + [0] * len(third.ids) + [1] * len(gen3)
    )
    assert traj.response_logprobs[: len(gen1)] == [-0.5] * len(gen1)
    assert len(tracker.training_samples()) == 1 and tracker.merges == 2 and tracker.splits == 0
    audit = tracker.current.builder.audit_drift()
    assert audit["retokenization_drift"] == 0, audit


def _two_calls(tracker: SampleTracker) -> list[dict[str, Any]]:
    tracker.prepare([SYSTEM, USER], [BASH_TOOL])
    generate(tracker, CALL_LS, {"role": "assistant", "content": None, "tool_calls": [call("bash", {"cmd": "ls"})]})
    history = [
        SYSTEM,
        USER,
        {"role": "assistant", "content": None, "tool_calls": [call("bash", '{"cmd": "ls"}')]},
        {"role": "tool", "content": "a.txt"},
    ]
    tracker.prepare(history, [BASH_TOOL])
    generate(
        tracker,
        CALL_CAT,
        {"role": "assistant", "content": None, "tool_calls": [call("bash", {"cmd": "cat a.txt", "n": 1})]},
    )
    return history + [
        {"role": "assistant", "content": None, "tool_calls": [call("bash", '{"cmd": "cat a.txt", "n": 1}')]},
        {"role": "tool", "content": "hi"},
    ]


@pytest.mark.parametrize(
    "rewrite, reason",
    [
        (lambda h: [h[0], {"role": "user", "content": "Summary: listed files."}, *h[4:]], "history_rewritten"),
        (lambda h: [h[0], h[1], *h[4:]], "messages_dropped"),
        (lambda h: [{"role": "system", "content": "Be brief."}, *h[1:]], "system_changed"),
        (lambda h: [*h[:2], {**h[2], "content": "I will list."}, *h[3:]], "assistant_edited"),
        (lambda h: [*h[:3], {"role": "tool", "content": "[output dropped]"}, *h[4:]], "history_rewritten"),
    ],
)
def test_a_rewritten_history_splits(tracker, rewrite, reason) -> None:
    history = _two_calls(tracker)
    prepared = tracker.prepare(rewrite(history), [BASH_TOOL])
    assert not prepared.merged and prepared.split_reason == reason
    generate(tracker, "Done.", {"role": "assistant", "content": "Done."})
    samples = tracker.training_samples()
    assert len(samples) == 2 and tracker.splits == 1 and tracker.split_reasons == {reason: 1}
    second = samples[1].trajectory
    assert second.prompt_ids == prepared.ids and sum(second.loss_mask) == len(ids_of("Done.")) + 1
    assert samples[0].calls == 2 and samples[1].calls == 1


def test_changed_tools_split_and_a_retry_reuses_the_prepared_call(tracker) -> None:
    history = _two_calls(tracker)
    again = tracker.prepare(history, [BASH_TOOL])
    assert tracker.prepare(history, [BASH_TOOL]) is again  # the call failed; the SDK retried
    assert tracker.merges == 1  # counted when a merged call generates
    other = {"type": "function", "function": {"name": "python", "parameters": {}}}
    assert tracker.prepare(history, [BASH_TOOL, other]).split_reason == "rewritten_after_failed_call"
    generate(tracker, "ok", {"role": "assistant", "content": "ok"})
    assert (
        tracker.prepare(
            history + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}], [BASH_TOOL]
        ).split_reason
        == "tools_changed"
    )
    generate(tracker, "ok", {"role": "assistant", "content": "ok"})
    assert tracker.split_reasons == {"rewritten_after_failed_call": 1, "tools_changed": 1}


def test_full_render_of_a_split_keeps_the_model_s_own_text(tracker) -> None:
    """An assistant reply raas generated is rendered from the model's text, not re-serialised
    from the harness's echo (whose JSON spacing differs)."""
    history = _two_calls(tracker)
    prepared = tracker.prepare([SYSTEM, {"role": "user", "content": "Task i-1 (again)"}, *history[2:]], [BASH_TOOL])
    assert prepared.split_reason == "history_rewritten"
    text = tracker.current.builder.tok.decode(prepared.ids)
    assert CALL_LS in text and CALL_CAT in text


def test_content_change_is_not_a_normalisation(tracker) -> None:
    history = _two_calls(tracker)
    history[2] = {**history[2], "content": " "}
    assert tracker.prepare(history, [BASH_TOOL]).split_reason == "assistant_edited"


def test_a_rewrite_that_does_not_fit_counts_once(tracker) -> None:
    history = _two_calls(tracker)
    assert tracker.merges == 1
    too_long = tracker.prepare(
        [SYSTEM, {"role": "user", "content": "notes " * 5000}], [BASH_TOOL]
    )  # over the 4096-token context
    assert not too_long.fits and too_long.split_reason == "history_rewritten"
    short = tracker.prepare([SYSTEM, {"role": "user", "content": "notes"}], [BASH_TOOL])
    assert short.fits and short.split_reason == "history_rewritten"
    generate(tracker, "ok", {"role": "assistant", "content": "ok"})
    assert tracker.splits == 1 and tracker.split_reasons == {"history_rewritten": 1}
    assert len(tracker.training_samples()) == 2 and history


def test_a_prompt_that_does_not_fit_is_not_a_sample() -> None:
    tok = load_chat_tokenizer(SMOLLM2, QWEN_TEMPLATE)
    tracker = SampleTracker(lambda: TrajectoryBuilder(tok, 64))
    prepared = tracker.prepare([SYSTEM, {"role": "user", "content": "word " * 200}], None)
    assert not prepared.fits and prepared.prompt_tokens > 64
    assert tracker.prepare([SYSTEM, USER], None).fits  # the harness shortened it
    assert tracker.splits == 0 and len(tracker.samples) == 1
