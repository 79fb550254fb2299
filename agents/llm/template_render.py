"""A chat template rendered exactly as `apply_chat_template(tokenize=False)` renders it, without
its per-call copying when the inputs are already plain JSON data; ids encoded by the Rust
tokenizer without the Python wrapper's per-call bookkeeping when that changes nothing.

transformers 5.x's `apply_chat_template` resolves the template, normalises the messages
(message objects to dicts, top-level keys whose value is None dropped), rebuilds every input
from plain JSON types (`_plain_template_data`), aliases reasoning fields, puts the tokenizer's
special tokens map under the caller's keyword arguments and renders the compiled template
(cached by the template's text). For messages, tools and arguments that are exact dicts,
lists, strings, numbers, booleans and None, without a reasoning field, every one of those
steps is an identity copy: `PlainRenderer` calls the same compiled template object with the
same arguments. Anything else (a message object, a tuple, a str subclass, a reasoning field,
a callable tool, a template name, a reserved argument name, a transformers without the
compile function) goes through `apply_chat_template` itself.

Why: the harness endpoint renders the whole conversation once per call (the template delta),
and the copying was a third of that render. tests/llm/test_template_render.py proves the two
paths equal over the tests' templates and tokenizers (ChatML, Qwen- and Llama-3.1-style).

The sandbox's `getattr` (every `message.role` of a template) first tries the Python attribute,
which for a dict key raises and catches an AttributeError before reading the key, and judges
every attribute it finds (`loop.index0`, `ns.last_user`) with a chain of isinstance tests: half
of a render. `install_fast_lookups` reads an exact dict's key at once when the name is no
attribute of dict (where the attribute lookup can only fail) and remembers the verdicts that
depend only on the type and the name; everything else is the sandbox's own, so what a template
may reach is unchanged.
"""

from __future__ import annotations

from typing import Any

import functools

# Names a message's reasoning may come under (apply_chat_template aliases them: not an identity).
REASONING_FIELDS = frozenset({"reasoning_content", "thinking", "reasoning"})
# Keyword names apply_chat_template or the render call would take for themselves.
RESERVED = frozenset(
    {
        "conversation",
        "conversations",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
_SCALARS = (str, int, float, bool)


@functools.cache
def _transformers() -> tuple[Any, Any, Any]:
    """(the function apply_chat_template compiles and caches templates with, the tokenizer base
    class, the fast tokenizer class); None for what this transformers lacks (its path is
    taken then). Imported on first use: the sandbox patch below is installed without them."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template as compile_template
    except ImportError:
        compile_template = None
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase as base
        from transformers.tokenization_utils_tokenizers import TokenizersBackend as fast
    except ImportError:
        base = fast = None
    return compile_template, base, fast


_DICT_NAMES = frozenset(dir(dict))  # every attribute an exact dict has (it has no __dict__)
# Types whose sandbox verdict on an attribute is a function of (type, name) alone: jinja's
# checks are isinstance tests against their class (no instance of these can pose as another).
_PURE_TYPES = (str, dict, list, int, float, bool)
MAX_VERDICTS = 4096  # remembered verdicts (names come from templates: bounded, not trusted)


def is_plain(value: Any) -> bool:
    """Whether `value` is built only of exact JSON types (what `_plain_template_data` keeps as is)."""
    kind = type(value)
    if value is None or kind in _SCALARS:
        return True
    if kind is dict:
        return all(type(k) is str and is_plain(v) for k, v in value.items())
    if kind is list:
        return all(is_plain(v) for v in value)
    return False


class PlainRenderer:
    """Renders `template` with `hf`'s special tokens, as `hf.apply_chat_template` would."""

    def __init__(self, hf: Any, template: str) -> None:
        self.hf = hf
        self.template = template
        self._compiled: Any = None  # compiled on the first render, where apply_chat_template would

    @property
    def compiled(self) -> Any:
        """The template as apply_chat_template compiles it (the same cached object)."""
        if self._compiled is None:
            self._compiled = _transformers()[0](self.template)
        return self._compiled

    def render(
        self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool, kwargs: dict[str, Any]
    ) -> str:
        """The rendered text (`tools`: passed to the template as apply_chat_template's `tools`)."""
        chat = self._plain_chat(messages, tools, kwargs)
        if chat is None:
            return self.slow(messages, tools, add_generation_prompt, kwargs)
        special = self.hf.special_tokens_map
        if not is_plain(special):
            return self.slow(messages, tools, add_generation_prompt, kwargs)
        return self.compiled.render(
            messages=chat,
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **{**special, **kwargs},
        )

    def slow(
        self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool, kwargs: dict[str, Any]
    ) -> str:
        """transformers' own path."""
        if tools is not None:
            kwargs = {**kwargs, "tools": tools}
        return self.hf.apply_chat_template(
            messages, chat_template=self.template, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
        )

    def _plain_chat(self, messages: Any, tools: Any, kwargs: dict[str, Any]) -> list[dict] | None:
        """The messages as apply_chat_template would pass them (None: take its own path)."""
        if _transformers()[0] is None or RESERVED.intersection(kwargs) or not is_plain(kwargs):
            return None
        if tools is not None and not (type(tools) is list and is_plain(tools) and all(type(t) is dict for t in tools)):
            return None
        if (
            type(messages) is not list
            or not messages
            or self.hf.get_chat_template(self.template, tools) != self.template
        ):
            return None
        chat = []
        for message in messages:
            if type(message) is not dict:
                return None
            copy = {}
            for key, value in message.items():
                if value is None:
                    continue  # what the normalisation drops
                if type(key) is not str or key in REASONING_FIELDS or (type(value) is not str and not is_plain(value)):
                    return None
                copy[key] = value
            chat.append(copy)
        return chat


def fast_encoder(hf: Any) -> Any | None:
    """The Rust tokenizer behind `hf` when `hf.encode(text, add_special_tokens=False)` is exactly
    its `encode(text, add_special_tokens=False).ids` right now (a fast tokenizer whose encode
    path is transformers' own, no truncation or padding set, special-token splitting as the
    wrapper sets it); None otherwise. Checked per call: it is a few attribute reads."""
    _, base, fast = _transformers()
    if fast is None or not isinstance(hf, fast):
        return None
    kind = type(hf)
    if kind.encode is not base.encode or kind._encode_plus is not fast._encode_plus:
        return None
    backend = getattr(hf, "_tokenizer", None)
    if backend is None or backend.truncation is not None or backend.padding is not None:
        return None
    if backend.encode_special_tokens != bool(hf.split_special_tokens):
        return None
    return backend


def fast_decoder(hf: Any) -> Any | None:
    """The Rust tokenizer behind `hf` when `hf.decode(ids, skip_special_tokens=False)` is exactly
    its `decode(ids, skip_special_tokens=False)` (a fast tokenizer with transformers' own decode
    path and no clean-up of tokenization spaces); None otherwise."""
    _, base, fast = _transformers()
    if fast is None or not isinstance(hf, fast):
        return None
    kind = type(hf)
    if kind.decode is not base.decode or kind._decode is not fast._decode or hf.clean_up_tokenization_spaces:
        return None
    return getattr(hf, "_tokenizer", None)


def install_fast_lookups(env_class: Any) -> None:
    """Make `env_class`'s attribute lookups cheaper with the same answers: an exact dict's key
    read at once when the name is no attribute of dict (the sandbox's lookup would fail on the
    attribute, then read the key), and the sandbox's verdict on an attribute remembered per
    (type, name) for the types whose verdict depends on nothing else (`_PURE_TYPES`, jinja's
    loop and namespace objects: `loop.index0`, `ns.last_user`)."""
    if getattr(env_class, "_raas_fast_lookups", False):
        return
    from jinja2.runtime import LoopContext
    from jinja2.utils import Namespace

    base_getattr, base_safe = env_class.getattr, env_class.is_safe_attribute
    pure = (*_PURE_TYPES, LoopContext)
    verdicts: dict[tuple[type, str], bool] = {}

    def getattr_(self: Any, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and type(attribute) is str and attribute not in _DICT_NAMES:
            try:
                return obj[attribute]
            except KeyError:  # as the sandbox's lookup ends
                return self.undefined(obj=obj, name=attribute)
        return base_getattr(self, obj, attribute)

    def is_safe_attribute(self: Any, obj: Any, attr: str, value: Any) -> bool:
        kind = type(obj)
        verdict = verdicts.get((kind, attr))
        if verdict is None:
            verdict = base_safe(self, obj, attr, value)
            if (kind in pure or issubclass(kind, Namespace)) and len(verdicts) < MAX_VERDICTS:
                verdicts[(kind, attr)] = verdict
        return verdict

    env_class._raas_base_lookups = (base_getattr, base_safe)  # the sandbox's own (tests compare)
    env_class.getattr, env_class.is_safe_attribute = getattr_, is_safe_attribute
    env_class._raas_fast_lookups = True
