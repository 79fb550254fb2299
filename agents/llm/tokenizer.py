"""The tokenizer and chat template that build a trajectory, loaded offline from a local folder.

A rollout's tokens must come from the same tokenizer the policy was trained with, so it is a
local Hugging Face folder (tokenizer.json + chat template), never a hub download. When a job
does not name one, the usual case is that trainer and service share a filesystem: the model
path a registered server reports in GET /v1/models is that folder.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from agents.llm.backends.http_client import shared_client
from core.errors import InvalidRequest

log = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# Stands in for an assistant message's content when locating what a template writes around it.
SENTINEL = "\x00raas-assistant-turn\x00"
MODELS_TIMEOUT = 3.0


class ChatTokenizer:
    """A Hugging Face tokenizer plus its chat template, rendering messages to text and ids.

    End of turn comes from the model's own files, never from a list of names: every
    `eos_token_id` of the tokenizer and of `generation_config.json` (Llama 3.1 lists
    `<|eot_id|>`, `<|eom_id|>` and `<|end_of_text|>`; Qwen `<|im_end|>` and `<|endoftext|>`),
    plus the token the chat template itself writes after an assistant message.
    """

    def __init__(self, hf_tokenizer: Any, chat_template: str | None = None,
                 generation_eos_ids: list[int] | None = None) -> None:
        self.hf = hf_tokenizer
        self.template = chat_template or hf_tokenizer.chat_template
        if not self.template:
            raise ValueError("the tokenizer has no chat template and none was given")
        self.supports_tools = "tools" in self.template
        # Rendering is pure but transformers' template cache is not documented thread-safe.
        self._lock = threading.Lock()
        self.close_text = self._assistant_close_text()
        self.turn_end_id = self._template_turn_end_id()
        self.end_ids = self._end_of_turn_ids(generation_eos_ids or [])
        # <|eom_id|> (Llama 3.1): the message ends and a tool result (ipython) comes next.
        self.eom_ids = frozenset(i for i in self.end_ids if self.token_text(i) == "<|eom_id|>")

    def _assistant_close_text(self) -> str:
        """What the template writes right after an assistant message's content."""
        probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": SENTINEL}]
        rendered = self.render(probe, add_generation_prompt=False)
        return rendered[rendered.index(SENTINEL) + len(SENTINEL):]

    def _template_turn_end_id(self) -> int | None:
        """The special token that opens the template's closing text (`<|im_end|>`, `<|eot_id|>`)."""
        ids = self.encode(self.close_text)
        special = set(self.hf.all_special_ids) | set(getattr(self.hf, "added_tokens_decoder", {}))
        return ids[0] if ids and ids[0] in special else None

    def _end_of_turn_ids(self, generation_eos_ids: list[int]) -> frozenset[int]:
        ids = set(generation_eos_ids)
        if self.hf.eos_token_id is not None:
            ids.add(self.hf.eos_token_id)
        if self.turn_end_id is not None:
            ids.add(self.turn_end_id)
        return frozenset(ids)

    def end_text_at(self, text: str) -> tuple[int, int] | None:
        """(start, end) of the first end-of-turn token written in `text`, if any."""
        found = [(text.find(t), len(t)) for t in (self.token_text(i) for i in self.end_ids)]
        found = [(at, n) for at, n in found if at >= 0]
        if not found:
            return None
        at, n = min(found)
        return at, at + n

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = False,
        **template_kwargs: Any,
    ) -> str:
        """The chat template applied to `messages` (tools passed only if the template uses them)."""
        kwargs = dict(template_kwargs)
        if tools and self.supports_tools:
            kwargs["tools"] = tools
        with self._lock:
            return self.hf.apply_chat_template(
                messages,
                chat_template=self.template,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **kwargs,
            )

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` alone; special tokens written in the text become their ids."""
        return list(self.hf.encode(text, add_special_tokens=False))

    @functools.cached_property
    def control_pattern(self) -> re.Pattern | None:
        """Matches the text of every added token (special or not, e.g. `<|im_start|>`,
        Qwen's `<tool_call>`), longest first; None when the tokenizer has none."""
        texts = {getattr(t, "content", str(t)) for t in
                 getattr(self.hf, "added_tokens_decoder", {}).values()}
        texts |= set(self.hf.all_special_tokens)
        texts = sorted((t for t in texts if t), key=len, reverse=True)
        return re.compile("|".join(map(re.escape, texts))) if texts else None

    def control_texts_in(self, text: str) -> list[tuple[int, int]]:
        """(start, end) of each added token's text written in `text`."""
        pattern = self.control_pattern
        return [m.span() for m in pattern.finditer(text)] if pattern and text else []

    def encode_untrusted(self, text: str, spans: list[tuple[int, int]]) -> list[int]:
        """Ids of a rendered `text` whose character `spans` hold untrusted message text (a tool's
        output): the template's own delimiters stay control tokens, but a control token's text
        inside a span is encoded as plain text, so a tool printing `<|im_end|>` never closes a
        turn. Text without such strings encodes exactly as `encode` does."""
        forged = [(a, b) for a, b in self.control_texts_in(text)
                  if any(start <= a and b <= end for start, end in spans)]
        if not forged:
            return self.encode(text)
        ids, at = [], 0
        for start, end in forged:
            ids += self.encode(text[at:start]) + self._plain(text[start:end])
            at = end
        return ids + self.encode(text[at:])

    def _plain(self, text: str) -> list[int]:
        """A control token's text as ordinary tokens: its first character apart, so the rest
        can no longer spell it (and, recursively, no other)."""
        head = self.encode(text[0])
        rest = text[1:]
        return head + self.encode_untrusted(rest, [(0, len(rest))]) if rest else head

    def split_counts(self, text: str, ids: list[int], cuts: list[int | None]) -> list[int]:
        """Token counts of the pieces of `text` cut at character offsets `cuts` (None = no cut
        there: the piece is merged into the next), given `ids = encode(text)`. A token that
        straddles a cut goes to the piece it starts in; the counts always add up to len(ids)."""
        offsets = self._offsets(text, ids)
        counts, start = [], 0
        for cut in cuts:
            if cut is None or offsets is None:
                counts.append(0)
                continue
            end = start
            while end < len(ids) and offsets[end] < cut:
                end += 1
            counts.append(end - start)
            start = end
        counts.append(len(ids) - start)
        return counts

    def _offsets(self, text: str, ids: list[int]) -> list[int] | None:
        """Start offset in `text` of each token of `ids` (None if the tokenizer cannot say)."""
        try:
            enc = self.hf(text, add_special_tokens=False, return_offsets_mapping=True)
        except (NotImplementedError, ValueError, TypeError):
            return None
        if list(enc["input_ids"]) != list(ids):
            return None
        return [start for start, _ in enc["offset_mapping"]]

    def decode(self, ids: list[int]) -> str:
        """Text of one generated turn for parsing (never re-encoded into the trajectory).

        Special tokens are kept (a model's `<tool_call>` or `<|python_tag|>` may be one); only
        the end-of-turn token the turn stopped on is dropped: the template writes its own.
        """
        ids = list(ids)
        while ids and ids[-1] in self.end_ids:
            ids.pop()
        return self.hf.decode(ids, skip_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        """Literal text of one token, special tokens included (e.g. "<|im_end|>")."""
        return self.hf.decode([token_id], skip_special_tokens=False)


def generation_eos_ids(folder: Path) -> list[int]:
    """The `eos_token_id`s of a model folder's generation_config.json (int or list)."""
    path = folder / "generation_config.json"
    if not path.is_file():
        return []
    try:
        value = json.loads(path.read_text()).get("eos_token_id")
    except (OSError, ValueError, AttributeError) as exc:
        log.warning("ignoring unreadable %s: %s", path, exc)
        return []
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int)]


_load_lock = threading.Lock()


def load_chat_tokenizer(path: str, chat_template: str | None = None) -> ChatTokenizer:
    """(`chat_template` is Jinja text: templates are resolved from registered names before
    they get here; never a path.) Load (once per process) the tokenizer folder `path`, optionally with another template."""
    # transformers' lazy first import is not thread-safe, and RUN workers open sessions in
    # threads: serialise loading (cached loads return at once).
    with _load_lock:
        return _load_chat_tokenizer(path, chat_template)


@functools.lru_cache(maxsize=16)
def _load_chat_tokenizer(path: str, chat_template: str | None) -> ChatTokenizer:
    from transformers import AutoTokenizer

    folder = Path(path)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(f"{path} has no tokenizer.json / tokenizer_config.json")
    hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    template = chat_template
    return ChatTokenizer(hf, template, generation_eos_ids(folder))


def is_tokenizer_folder(path: str | None) -> bool:
    """True when `path` is a local folder holding a Hugging Face tokenizer."""
    return bool(path) and any(os.path.isfile(os.path.join(path, n)) for n in TOKENIZER_FILES)


def list_models(url: str) -> list[dict]:
    """The entries of a server's GET /v1/models ([] when it cannot be asked)."""
    try:
        response = shared_client().get(f"{url.rstrip('/')}/v1/models", timeout=MODELS_TIMEOUT)
        response.raise_for_status()
        entries = response.json().get("data", [])
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        log.info("cannot list models of %s: %s", url, exc)
        return []
    return [e for e in entries if isinstance(e, dict)]


_served_lengths: dict[str, tuple[float, int | None]] = {}  # url -> (expires at, length)
SERVED_LENGTH_TTL = 300.0
UNREACHABLE_TTL = 30.0  # a server that did not answer is asked again after this long


def server_max_model_len(url: str) -> int | None:
    """The context length a server reports in GET /v1/models (vLLM's `max_model_len`).

    Cached per process (SERVED_LENGTH_TTL; UNREACHABLE_TTL when it did not answer, so a down
    server does not cost every submission a timeout); None when the server does not say.
    """
    now = time.monotonic()
    cached = _served_lengths.get(url)
    if cached is not None and now < cached[0]:
        return cached[1]
    entries = list_models(url)
    lengths = [e.get("max_model_len") for e in entries]
    value = min((n for n in lengths if isinstance(n, int) and n > 0), default=None)
    _served_lengths[url] = (now + (SERVED_LENGTH_TTL if entries else UNREACHABLE_TTL), value)
    return value


def remember_max_model_len(url: str, max_model_len: int) -> None:
    """Record a limit a server stated in an error (it did not report it in /v1/models)."""
    _served_lengths[url] = (time.monotonic() + SERVED_LENGTH_TTL, max_model_len)


def server_model_paths(url: str) -> list[str]:
    """Model roots and ids a server lists: candidates for a local tokenizer folder."""
    paths = []
    for entry in list_models(url):
        paths += [p for p in (entry.get("root"), entry.get("id")) if isinstance(p, str)]
    return paths


def resolve_tokenizer_path(spec: Any, registered: Callable[[], list[str]] = list) -> str:
    """The tokenizer folder of an LLMSpec: named, else a server's local model path, else 4xx.

    `registered()` lists the registered servers' urls, asked only when the spec names none.
    """
    if spec.tokenizer:
        if not is_tokenizer_folder(spec.tokenizer):
            raise InvalidRequest(
                f"llm.tokenizer: {spec.tokenizer!r} is not a local folder with tokenizer.json",
                field="llm.tokenizer",
            )
        return spec.tokenizer
    from agents.llm.pool import candidate_urls

    urls = candidate_urls(spec, registered)
    if not urls:
        raise InvalidRequest(
            "no LLM server is registered: register one with `raas llm add URL` (a vLLM or "
            "SGLang server; `raas llm-sim` serves a demo one), or name llm.servers in the job",
            field="llm.servers",
        )
    for url in urls:
        for path in server_model_paths(url):
            if is_tokenizer_folder(path):
                return path
    raise InvalidRequest(
        "llm.tokenizer is required: no registered server reports a model path that exists "
        "locally as a tokenizer folder",
        field="llm.tokenizer",
    )
