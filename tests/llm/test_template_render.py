"""The fast render and encode paths (`agents.llm.template_render`) give exactly what transformers'
`apply_chat_template` and `encode` give, over the tests' templates and tokenizers (SmolLM2's
ChatML, the Qwen-style tool template, the Qwen3- and Llama-3.1-style folders), on a few hundred
seeded random conversations: tool calls (arguments as dicts and as strings), tool results,
None values, control-token texts in message content, unicode; with and without tools and the
generation prompt. Inputs the fast path cannot prove plain take transformers' own path."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from agents.llm.template_budget import render_budget
from agents.llm.template_render import PlainRenderer, fast_decoder, fast_encoder, is_plain
from agents.llm.tokenizer import load_chat_tokenizer
from tests.llm.conftest import QWEN_TEMPLATE, SMOLLM2, TOOLS

WORDS = ["ls", "src/", "<|im_end|>", "<tool_call>", "</think>", "<|eot_id|>", "ünï", "日本", "  ", "\n", "{x}", "%"]


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(WORDS) + rng.choice(["", " ", "\n"]) for _ in range(rng.randint(0, 8)))


def _message(rng: random.Random, role: str) -> dict:
    message: dict = {"role": role, "content": _text(rng) if rng.random() > 0.02 else None}
    if role == "assistant" and rng.random() < 0.5:
        args = {"cmd": _text(rng), "n": rng.randint(0, 9)} if rng.random() < 0.7 else '{"cmd": "ls"}'
        message["tool_calls"] = [{"type": "function", "function": {"name": "bash", "arguments": args}}]
    if role == "tool" and rng.random() < 0.5:
        message["name"] = "bash"
    return message


def _conversation(rng: random.Random) -> list[dict]:
    messages = [_message(rng, "system")] if rng.random() < 0.7 else []
    messages.append({"role": "user", "content": _text(rng) or "hi"})
    for _ in range(rng.randint(0, 6)):
        messages += [_message(rng, "assistant"), _message(rng, rng.choice(["tool", "user"]))]
    return messages


@pytest.fixture(params=["smollm2", "qwen-template", "qwen3-style", "llama31-style"])
def tokenizer(request: pytest.FixtureRequest):
    if request.param == "smollm2":
        return load_chat_tokenizer(SMOLLM2)
    if request.param == "qwen-template":
        return load_chat_tokenizer(SMOLLM2, Path(QWEN_TEMPLATE).read_text())
    folder = request.getfixturevalue("qwen3_dir" if request.param == "qwen3-style" else "llama31_dir")
    return load_chat_tokenizer(folder)


def _reference(tok, messages: list[dict], tools: list[dict] | None, generation_prompt: bool) -> str:
    kwargs = {"tools": tools} if tools else {}
    return tok.hf.apply_chat_template(
        messages, chat_template=tok.template, tokenize=False, add_generation_prompt=generation_prompt, **kwargs
    )


def test_fast_render_equals_apply_chat_template(tokenizer) -> None:
    rng = random.Random(36)
    renderer = tokenizer.renderer
    assert isinstance(renderer, PlainRenderer)
    for _ in range(150):
        messages = _conversation(rng)
        tools = TOOLS if rng.random() < 0.5 else None
        prompt = rng.random() < 0.7
        assert renderer._plain_chat(messages, tools, {}) is not None  # the fast path is taken
        try:
            expected = _reference(tokenizer, messages, tools, prompt)
        except Exception as exc:  # noqa: BLE001 - a template that refuses it refuses it both ways
            with pytest.raises(type(exc)):
                tokenizer.render(messages, tools, prompt)
            continue
        assert tokenizer.render(messages, tools, prompt) == expected
        encoded = tokenizer.encode(expected)
        assert encoded == list(tokenizer.hf.encode(expected, add_special_tokens=False))


def test_inputs_the_fast_path_cannot_prove_plain_take_transformers_path(tokenizer) -> None:
    class Text(str):
        pass

    renderer = tokenizer.renderer
    cases = [
        [{"role": "user", "content": Text("hi")}],  # a str subclass: rebuilt as str by transformers
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a", "reasoning": "why"}],
        [{"role": "user", "content": ("a", "b")}],  # a tuple
    ]
    for messages in cases:
        assert renderer._plain_chat(messages, None, {}) is None
        try:
            expected = _reference(tokenizer, messages, None, True)
        except Exception:  # noqa: BLE001 - refused by the template: nothing to compare
            continue
        assert tokenizer.render(messages, None, True) == expected
    assert renderer._plain_chat([{"role": "user", "content": "hi"}], None, {"messages": []}) is None
    assert renderer._plain_chat([{"role": "user", "content": "hi"}], [lambda x: x], {}) is None


def test_template_kwargs_reach_the_template_as_in_apply_chat_template(qwen3_dir) -> None:
    tok = load_chat_tokenizer(qwen3_dir)
    messages = [{"role": "user", "content": "hi"}]
    for kwargs in ({"enable_thinking": False}, {"enable_thinking": True}, {"eos_token": "<x>"}):
        expected = tok.hf.apply_chat_template(
            messages, chat_template=tok.template, tokenize=False, add_generation_prompt=True, **kwargs
        )
        assert tok.render(messages, None, True, **kwargs) == expected


def test_fast_encoder_steps_aside_when_the_wrapper_would_encode_differently() -> None:
    tok = load_chat_tokenizer(SMOLLM2)
    assert fast_encoder(tok.hf) is not None
    tok.hf.split_special_tokens = True  # the wrapper would spell `<|im_end|>` as plain text
    try:
        assert fast_encoder(tok.hf) is None
        assert tok.encode("<|im_end|>") == list(tok.hf.encode("<|im_end|>", add_special_tokens=False))
    finally:
        tok.hf.split_special_tokens = False


def test_fast_decoder_is_transformers_decode() -> None:
    tok = load_chat_tokenizer(SMOLLM2)
    assert fast_decoder(tok.hf) is not None
    ids = tok.encode('<tool_call>\n{"a": 1}</tool_call> ok , !') + [2, 0, 49151]
    assert fast_decoder(tok.hf).decode(ids, skip_special_tokens=False) == tok.hf.decode(ids, skip_special_tokens=False)
    tok.hf.clean_up_tokenization_spaces = True  # the wrapper would edit the text: it decodes
    try:
        assert fast_decoder(tok.hf) is None
    finally:
        tok.hf.clean_up_tokenization_spaces = False


def test_a_render_that_raises_leaves_no_deadline_to_fire_later() -> None:
    """A template's own error ends its render's budget: no interrupt lands on this thread
    (or a later one with its id) once the deadline passes."""
    renderer = PlainRenderer(load_chat_tokenizer(SMOLLM2).hf, "{{ raise_exception('the template says no') }}")
    with pytest.raises(Exception, match="the template says no"):
        with render_budget(0.05):
            renderer.render([{"role": "user", "content": "x"}], None, False, {})
    until = time.monotonic() + 0.4
    while time.monotonic() < until:  # bytecode runs here: a pending interrupt would be raised
        time.sleep(0.01)


def test_is_plain() -> None:
    assert is_plain({"a": [1, 2.0, True, None, "x", {"b": []}]})
    assert not is_plain({"a": (1,)})
    assert not is_plain({1: "a"})
    assert not is_plain([object()])


def test_fast_lookups_answer_as_the_sandbox_does() -> None:
    """The patched lookup and verdicts against jinja's own: dict keys that are and are not dict
    attributes, missing keys, other types; every attribute name of the remembered types."""
    from jinja2.runtime import LoopContext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.utils import Namespace

    own_getattr, own_safe = ImmutableSandboxedEnvironment._raas_base_lookups
    env = ImmutableSandboxedEnvironment()
    data = {"role": "user", "items": 1, "get": 2, "__class__": 3, "content": None}
    for obj in (data, {}, "text", ["a"], 5, None):
        for name in ("role", "items", "get", "keys", "__class__", "__init__", "content", "missing", "mro", "upper"):
            mine, theirs = env.getattr(obj, name), own_getattr(env, obj, name)
            assert type(mine) is type(theirs)
            if not callable(theirs):
                assert repr(mine) == repr(theirs)
    loop = LoopContext(iter([1, 2]), env.undefined)
    for obj in ("s", {"a": 1}, [1], 1, 1.5, True, loop, Namespace(a=1)):
        for name in [*dir(type(obj)), "pop", "append", "update", "clear", "mro", "__globals__", "x"]:
            value = getattr(obj, name, None)
            for _ in range(2):  # the second answer is the remembered one
                assert env.is_safe_attribute(obj, name, value) == own_safe(env, obj, name, value), (obj, name)


def test_templates_render_the_same_with_the_sandbox_own_lookups(tokenizer) -> None:
    from jinja2.sandbox import ImmutableSandboxedEnvironment as Env

    rng = random.Random(7)
    cases = [(_conversation(rng), TOOLS if rng.random() < 0.5 else None) for _ in range(40)]

    def renders() -> list[str]:
        out = []
        for messages, tools in cases:
            try:
                out.append(tokenizer.render(messages, tools, True))
            except Exception as exc:  # noqa: BLE001 - compared as the error's type
                out.append(type(exc).__name__)
        return out

    patched = renders()
    saved = Env.getattr, Env.is_safe_attribute
    Env.getattr, Env.is_safe_attribute = Env._raas_base_lookups
    try:
        assert renders() == patched
    finally:
        Env.getattr, Env.is_safe_attribute = saved
