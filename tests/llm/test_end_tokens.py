"""End of turn from the model's files, and tool-call tags that are special tokens (issue 12, 5-6).

Qwen3-style and Llama-3.1-style tokenizers are built offline from SmolLM2's (tests/llm/styles.py).
"""

from __future__ import annotations

from agents.llm import parse_tool_calls
from agents.llm.tokenizer import load_chat_tokenizer
from agents.llm.trajectory import TrajectoryBuilder
from tests.llm.conftest import TOOLS

PROMPT = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "List files."}]
CALL = '<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>'


def builder(folder: str) -> TrajectoryBuilder:
    return TrajectoryBuilder(load_chat_tokenizer(folder), max_model_len=4096)


def token(b: TrajectoryBuilder, text: str) -> int:
    return b.tok.hf.convert_tokens_to_ids(text)


def test_end_ids_come_from_tokenizer_generation_config_and_template(qwen3_dir, llama31_dir, tokenizer_dir) -> None:
    llama = load_chat_tokenizer(llama31_dir)
    names = {llama.token_text(i) for i in llama.end_ids}
    assert names == {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"}
    assert {llama.token_text(i) for i in llama.eom_ids} == {"<|eom_id|>"}
    assert llama.token_text(llama.turn_end_id) == "<|eot_id|>"
    qwen = load_chat_tokenizer(qwen3_dir)
    assert {qwen.token_text(i) for i in qwen.end_ids} == {"<|im_end|>", "<|endoftext|>"}
    # SmolLM2 ships no generation config: eos and the template's <|im_end|> (the same token).
    assert {load_chat_tokenizer(tokenizer_dir).token_text(i) for i in load_chat_tokenizer(tokenizer_dir).end_ids} == {
        "<|im_end|>"
    }


def test_llama31_eom_tool_turn_gets_no_inserted_eot(llama31_dir) -> None:
    b = builder(llama31_dir)
    prompt = b.start(PROMPT, TOOLS)
    eom, eot = token(b, "<|eom_id|>"), token(b, "<|eot_id|>")
    first = b.tok.encode(CALL) + [eom]
    text = b.add_generation(first, [-0.1] * len(first), "stop", "v1")
    assert parse_tool_calls(text)[0][0].arguments == {"cmd": "ls"}
    delta = b.add_messages([{"role": "tool", "content": "a.txt"}])
    # Before: the builder did not know <|eom_id|> and put <|eot_id|> (mask 0) after it.
    assert eot not in delta[:1]
    assert b.tok.hf.decode(delta) == (
        "<|start_header_id|>ipython<|end_header_id|>\n\na.txt"
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    second = b.tok.encode("Two files.") + [eot]
    b.add_generation(second, [-0.1] * len(second), "stop", "v1")
    traj = b.trajectory()
    assert traj.response_ids == first + delta + second
    assert traj.loss_mask == [1] * len(first) + [0] * len(delta) + [1] * len(second)
    # A re-render closes the first message with <|eot_id|>: the audit reports it in turn 0,
    # at the sampled <|eom_id|>. (The other differences are the template's "\n\n" after each
    # header, one token `ĊĊ` when a text ends there but `Ċ`,`Ċ` before content: real seams.)
    report = b.audit_drift()
    by_turn = {t["turn"]: t for t in report["drift_turns"]}
    assert by_turn[0]["first_diff"] == len(prompt) + len(first) - 1
    assert report["retokenization_drift"] == sum(t["differing_tokens"] for t in by_turn.values())


def test_llama31_eom_differs_from_eot_by_exactly_one_audited_token(llama31_dir) -> None:
    reports = {}
    for end in ("<|eot_id|>", "<|eom_id|>"):
        b = builder(llama31_dir)
        b.start(PROMPT, TOOLS)
        first = b.tok.encode(CALL) + [token(b, end)]
        b.add_generation(first, [-0.1] * len(first), "stop", "v1")
        b.add_messages([{"role": "tool", "content": "a.txt"}])
        second = b.tok.encode("Done.") + [token(b, "<|eot_id|>")]
        b.add_generation(second, [-0.1] * len(second), "stop", "v1")
        reports[end] = {t["turn"]: t["differing_tokens"] for t in b.audit_drift()["drift_turns"]}
    eot, eom = reports["<|eot_id|>"], reports["<|eom_id|>"]
    assert eom[0] == eot.get(0, 0) + 1 and {k: v for k, v in eom.items() if k != 0} == {
        k: v for k, v in eot.items() if k != 0
    }


def test_qwen3_endoftext_ends_the_turn(qwen3_dir) -> None:
    b = builder(qwen3_dir)
    b.start(PROMPT, TOOLS)
    endoftext, im_end = token(b, "<|endoftext|>"), token(b, "<|im_end|>")
    first = b.tok.encode("Looking.") + [endoftext]
    b.add_generation(first, [-0.1] * len(first), "stop", "v1")
    delta = b.add_messages([{"role": "user", "content": "Go on."}])
    assert im_end not in delta[:1]  # before: <|im_end|> was inserted after <|endoftext|>
    assert b.tok.hf.decode(delta).startswith("\n<|im_start|>user\nGo on.")


def test_tool_call_tags_that_are_special_tokens_parse(qwen3_dir) -> None:
    b = builder(qwen3_dir)
    b.start(PROMPT, TOOLS)
    ids = b.tok.encode("<think>\nlook first\n</think>\n\n" + CALL) + [token(b, "<|im_end|>")]
    assert token(b, "<tool_call>") in ids  # the tag is one special token here
    # What the old decoder (skip_special_tokens=True) gave the parser: no tags, no call.
    assert parse_tool_calls(b.tok.hf.decode(ids, skip_special_tokens=True)) == ([], [])
    text = b.add_generation(ids, [-0.1] * len(ids), "stop", "v1")
    calls, errors = parse_tool_calls(text)
    assert [c.to_dict() for c in calls] == [{"name": "bash", "arguments": {"cmd": "ls"}}]
    assert errors == [] and not text.endswith("<|im_end|>")
    b.add_messages([{"role": "tool", "content": "a.txt"}])
    assert b.audit_drift()["retokenization_drift"] == 0


def test_llama31_eom_tool_turn_through_the_session(llama31_dir) -> None:
    """The same seam over HTTP: the simulator (a vLLM fake) ends the tool turn with eom."""
    from agents.llm import LLMSession
    from fakellm.server import start_simulator
    from tests.llm.conftest import deadline

    script = {
        "turn_marker": "<|start_header_id|>assistant",
        "default": [{"text": CALL, "end_token": "<|eom_id|>"}, "Two files."],
    }
    url, stop = start_simulator(llama31_dir, script)
    spec = {"servers": [{"url": url}], "tokenizer": llama31_dir, "max_model_len": 2048}
    try:
        with LLMSession.open(spec, {"max_tokens": 200}, "llama-eom") as s:
            s.start(PROMPT, TOOLS)
            first = s.generate(deadline())
            eom, eot = (s.builder.tok.hf.convert_tokens_to_ids(t) for t in ("<|eom_id|>", "<|eot_id|>"))
            assert first.token_ids[-1] == eom and first.finish_reason == "stop"
            assert parse_tool_calls(first.text)[0][0].name == "bash"
            delta = s.append_messages([{"role": "tool", "content": "a.txt"}])
            assert delta[0] != eot
            second = s.generate(deadline())
            assert second.token_ids[-1] == eot and second.text == "Two files."
    finally:
        stop()
