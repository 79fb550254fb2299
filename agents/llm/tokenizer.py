"""The tokenizer and chat template that build a trajectory, loaded offline from a local folder.

A rollout's tokens must come from the same tokenizer the policy was trained with, so it is a
local Hugging Face folder (tokenizer.json + chat template), never a hub download. A name is a
folder, or a hub id (`Qwen/Qwen2.5-0.5B-Instruct`, what `vllm serve` reports) found in the
local Hugging Face cache (`agents.llm.hub_cache`). When a job does not name one, the model a
registered server reports in GET /v1/models is used: its folder, or its id in the cache. A
server that does not answer is named as unreachable in the submission's 400.
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
from agents.llm.prompt_cache import PromptCache
from agents.llm.template_render import PlainRenderer, fast_decoder, fast_encoder
from agents.llm.hub_cache import cached_tokenizer_folder, hub_cache_dir, hub_repo_dir, is_hub_id
from agents.llm.template_budget import (
    capped_output,
    check_template,
    render_budget,
    render_sample,
)
from core.errors import InvalidRequest

log = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# Stands in for an assistant message's content when locating what a template writes around it.
SENTINEL = "\x00raas-assistant-turn\x00"
MODELS_TIMEOUT = 3.0
# A trusted template to load a folder's tokenizer with, whatever its own chat template is.
PLAIN_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"


class ChatTokenizer:
    """A Hugging Face tokenizer plus its chat template, rendering messages to text and ids.

    End of turn comes from the model's own files, never from a list of names: every
    `eos_token_id` of the tokenizer and of `generation_config.json` (Llama 3.1 lists
    `<|eot_id|>`, `<|eom_id|>` and `<|end_of_text|>`; Qwen `<|im_end|>` and `<|endoftext|>`),
    plus the token the chat template itself writes after an assistant message.
    """

    def __init__(
        self, hf_tokenizer: Any, chat_template: str | None = None, generation_eos_ids: list[int] | None = None
    ) -> None:
        self.hf = hf_tokenizer
        self.template = chat_template or hf_tokenizer.chat_template
        if not self.template:
            raise ValueError("the tokenizer has no chat template and none was given")
        self.supports_tools = "tools" in self.template
        self.renderer = PlainRenderer(hf_tokenizer, self.template)  # apply_chat_template's result, faster
        # Rendering is pure but transformers' template cache is not documented thread-safe.
        self._lock = threading.Lock()
        self.prompts = PromptCache()  # first prompts rendered with this template (GRPO groups)
        # Whether a delta may be rendered after the conversation's head alone, and filled in
        # from a render of its messages' shape: each is checked against the whole render and
        # is off for good in this process after a miss of its own (`TrajectoryBuilder.check_delta`).
        self.speculative_deltas = True
        self.shaped_deltas = True
        self.close_text = self._assistant_close_text()
        self.turn_end_id = self._template_turn_end_id()
        self.end_ids = self._end_of_turn_ids(generation_eos_ids or [])
        # <|eom_id|> (Llama 3.1): the message ends and a tool result (ipython) comes next.
        self.eom_ids = frozenset(i for i in self.end_ids if self.token_text(i) == "<|eom_id|>")

    def _assistant_close_text(self) -> str:
        """What the template writes right after an assistant message's content."""
        probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": SENTINEL}]
        rendered = self.render(probe, add_generation_prompt=False)
        return rendered[rendered.index(SENTINEL) + len(SENTINEL) :]

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
        schemas = tools if tools and self.supports_tools else None
        with self._lock, render_budget():
            return capped_output(self.renderer.render(messages, schemas, add_generation_prompt, template_kwargs))

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` alone; special tokens written in the text become their ids."""
        backend = fast_encoder(self.hf)  # the same ids without the wrapper's bookkeeping
        if backend is not None:
            return backend.encode(text, add_special_tokens=False).ids
        return list(self.hf.encode(text, add_special_tokens=False))

    @functools.cached_property
    def control_pattern(self) -> re.Pattern | None:
        """Matches the text of every added token (special or not, e.g. `<|im_start|>`,
        Qwen's `<tool_call>`), longest first; None when the tokenizer has none."""
        texts = {getattr(t, "content", str(t)) for t in getattr(self.hf, "added_tokens_decoder", {}).values()}
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
        forged = [
            (a, b) for a, b in self.control_texts_in(text) if any(start <= a and b <= end for start, end in spans)
        ]
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
        if not cuts:
            return [len(ids)]  # one piece (a turn's single new message): nothing to locate
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
        backend = fast_decoder(self.hf)  # the same text without the wrapper's bookkeeping
        if backend is not None:
            return backend.decode(ids, skip_special_tokens=False)
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
    they get here; never a path.) Load (once per process) the tokenizer folder `path`, optionally
    with another template."""
    # transformers' lazy first import is not thread-safe, and RUN workers open sessions in
    # threads: serialise loading (cached loads return at once).
    with _load_lock:
        return _load_chat_tokenizer(path, chat_template)


@functools.lru_cache(maxsize=16)
def _load_chat_tokenizer(path: str, chat_template: str | None) -> ChatTokenizer:
    folder, hf = _load_hf_tokenizer(path)
    return ChatTokenizer(hf, chat_template, generation_eos_ids(folder))


def _load_hf_tokenizer(path: str) -> tuple[Path, Any]:
    """(the folder, transformers' tokenizer) of the tokenizer `path` names."""
    from transformers import AutoTokenizer

    folder = Path(tokenizer_folder(path) or path)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(
            f"{path} has no tokenizer.json / tokenizer_config.json (nor "
            f"is it a model id in the Hugging Face cache {hub_cache_dir()})"
        )
    return folder, AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def check_template_here(path: str, chat_template: str) -> None:
    """`template_checker.check_untrusted_template` in this process: its bounded child is forked
    from here, so this process must run one thread (the template checker does: it loads
    transformers' tokenizer alone, as a ChatTokenizer's first render would start the render
    watchdog)."""
    try:
        folder, hf = _hf_tokenizer_for_checks(path)  # loaded here, shared by the fork
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"llm.tokenizer: cannot load {path!r}: {exc}", field="llm.tokenizer") from exc
    check_template(lambda: render_sample(ChatTokenizer(hf, chat_template, generation_eos_ids(folder))))


_hf_tokenizer_for_checks = functools.lru_cache(maxsize=16)(_load_hf_tokenizer)


def is_tokenizer_folder(path: str | None) -> bool:
    """True when `path` is a local folder holding a Hugging Face tokenizer."""
    return bool(path) and any(os.path.isfile(os.path.join(path, n)) for n in TOKENIZER_FILES)


def tokenizer_folder(name: str | None) -> str | None:
    """The local folder a tokenizer name stands for: the folder itself, or a hub id's cached
    snapshot; None when neither exists here."""
    if not name:
        return None
    if is_tokenizer_folder(name):
        return name
    return cached_tokenizer_folder(name)


def probe_models(url: str) -> tuple[list[dict], str | None]:
    """The entries of a server's GET /v1/models and, when it did not answer, why."""
    try:
        response = shared_client().get(f"{url.rstrip('/')}/v1/models", timeout=MODELS_TIMEOUT)
        response.raise_for_status()
        entries = response.json().get("data", [])
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        log.info("cannot list models of %s: %s", url, exc)
        return [], f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return [e for e in entries if isinstance(e, dict)], None


def list_models(url: str) -> list[dict]:
    """The entries of a server's GET /v1/models ([] when it cannot be asked)."""
    return probe_models(url)[0]


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


# vLLM/SGLang error texts for a request longer than the server's context.
# vLLM: "maximum context length is 4096 tokens"; SGLang: "... context length (4096 tokens)".
CONTEXT_ERRORS = ("maximum context length", "max_model_len", "context length", "too long")
CONTEXT_LIMIT = re.compile(r"maximum context length is (\d+)|context length \((\d+) tokens")


def is_context_error(message: str) -> bool:
    """Whether a server's 400 says the request is longer than its context."""
    return any(text in message.lower() for text in CONTEXT_ERRORS)


def stated_context_limit(message: str) -> int | None:
    """The context length a server's error names (when it did not report it in /v1/models)."""
    match = CONTEXT_LIMIT.search(message)
    return int(match.group(1) or match.group(2)) if match else None


_served_models: dict[str, str | None] = {}  # url -> the first model it lists


def served_model(url: str) -> str | None:
    """The first model a server lists (cached); vLLM rejects requests naming another one."""
    if url not in _served_models:
        models = list_models(url)
        _served_models[url] = models[0].get("id") if models else None
    return _served_models[url]


def model_names(entries: list[dict]) -> list[str]:
    """Model roots and ids a server lists: candidates for a tokenizer (folder or hub id)."""
    names: list[str] = []
    for entry in entries:
        names += [p for p in (entry.get("root"), entry.get("id")) if isinstance(p, str)]
    return names


def served_tokenizer(name: str, allowed: Callable[[str], bool] | None = None) -> bool:
    """Whether a model name a server reports gives a tokenizer here: its folder, or (a hub id)
    its snapshot in the Hugging Face cache. `allowed` judges the folder, or the cache entry,
    before anything is looked up (no existence oracle for a tenant)."""
    if (allowed is None or allowed(name)) and is_tokenizer_folder(name):
        return True
    return (
        is_hub_id(name)
        and (allowed is None or allowed(str(hub_repo_dir(name))))
        and cached_tokenizer_folder(name) is not None
    )


def resolve_tokenizer_path(
    spec: Any, registered: Callable[[], list[str]] = list, allowed: Callable[[str], bool] | None = None
) -> str:
    """The tokenizer of an LLMSpec, as a name `load_chat_tokenizer` loads (a folder or a cached
    hub id): named, else a server's model, else a 4xx that says which servers did not answer.

    `registered()` lists the registered servers' urls, asked only when the spec names none.
    A path a server reports is used only when `allowed(path)` (the caller's tokenizer policy),
    judged before its existence, so a forbidden and a missing folder get the same answer.
    """
    if spec.tokenizer:
        if tokenizer_folder(spec.tokenizer) is None:
            raise InvalidRequest(
                f"llm.tokenizer: {spec.tokenizer!r} is neither a local folder with "
                f"tokenizer.json nor a model id in the Hugging Face cache {hub_cache_dir()} "
                f"(set HF_HOME where the models were downloaded)",
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
    unreachable: list[str] = []
    served: list[str] = []
    for url in urls:
        entries, error = probe_models(url)
        if error is not None:
            unreachable.append(f"{url} ({error})")
        for name in model_names(entries):
            if served_tokenizer(name, allowed):
                return name
            served.append(name)
    down = f"; no answer from {', '.join(unreachable)}" if unreachable else ""
    if not served:
        raise InvalidRequest(
            f"the LLM server{'s' if len(urls) > 1 else ''} did not answer GET /v1/models{down}: "
            "start it, remove it (`raas llm rm URL`), or name llm.servers and llm.tokenizer",
            field="llm.servers",
        )
    # A tenant's answer names neither the models nor the cache: forbidden and missing read alike.
    what = "a model" if allowed is not None else ", ".join(sorted(set(served)))
    where = (
        " under the operator's tokenizer roots"
        if allowed is not None
        else f" nor a model id in the Hugging Face cache {hub_cache_dir()} (set HF_HOME)"
    )
    raise InvalidRequest(
        f"llm.tokenizer is required: the servers serve {what}, not a local tokenizer "
        f"folder{where}; name llm.tokenizer{down}",
        field="llm.tokenizer",
    )
