"""The rendered first prompt of a conversation, kept per process for the samples that share it.

A GRPO job runs `n_samples` rollouts of every instance, each starting from the same system and
user messages with the same tool schemas: rendering that prompt (the chat template two or
three times, for the message spans and per-message token counts) and encoding it was ~3 ms of
a RUN worker's CPU per rollout, the same result every time. `TrajectoryBuilder.start` asks
here first. Each `ChatTokenizer` holds its own cache (one tokenizer folder and template: one
per process, `load_chat_tokenizer`), keyed by the rest of what the result depends on: the
messages, the tools and the template's keyword arguments, as JSON in their own key order. A template that
reads the clock (`strftime_now`) is never cached, since its render is not a function of those.

Values are immutable (JSON text and tuples) and every `get` returns fresh lists and message
dicts, so no two trajectories share an object. The cache is bounded (least recently used
entries go first) and thread-safe.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

MAX_ENTRIES = 256

# (the messages as rendered (defused if needed) as JSON text, prompt ids, per-message counts)
Prompt = tuple[str, tuple[int, ...], tuple[int, ...]]


class PromptCache:
    """A bounded LRU of rendered first prompts."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, Prompt] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    @staticmethod
    def key(template: str, messages: list[dict], tools: list[dict] | None, kwargs: dict) -> str | None:
        """The entry's key, or None when the render cannot be cached (a clock in the
        template, or messages that are not plain JSON)."""
        if "strftime_now" in template:
            return None
        try:
            # Key order is kept: a template renders a schema as written (transformers' `tojson`
            # does not sort), so tools that differ only in key order are different prompts.
            return json.dumps([messages, tools, kwargs], ensure_ascii=False)
        except (TypeError, ValueError):
            return None

    def get(self, key: str) -> tuple[list[dict], list[int], list[int]] | None:
        """(messages, prompt ids, counts) as new objects, or None (then render and `put`)."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
        return json.loads(found[0]), list(found[1]), list(found[2])

    def put(self, key: str, messages: list[dict], prompt: list[int], counts: list[int]) -> None:
        value = (json.dumps(messages, ensure_ascii=False), tuple(prompt), tuple(counts))
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
