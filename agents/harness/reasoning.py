"""A reply's reasoning out of band: split from `<think>` markup, put back when the harness echoes it.

The Responses and generateContent APIs carry a model's reasoning apart from its answer (a
`reasoning` item, a `thought` part), and a harness may echo it back, rewrite it or drop it (the
Gemini CLI keeps no thoughts in its history). The merge check compares the echoed assistant
turn with the reply raas registered (`Completion.content`, think block included), so the wire
that split a reply remembers, per rollout, the content behind each visible answer: the echoed
turn becomes that content again and the tool loop stays one sample. A visible answer raas
never returned is rebuilt from what was sent (and then splits, as any rewritten turn does).
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from agents.harness.messages import arguments_of

_THINK = re.compile(r"\s*(?:<think>)?(.*?)</think>\s*", re.DOTALL)


def split_reasoning(content: str | None) -> tuple[str | None, str]:
    """(reasoning, visible answer) of a reply's content; reasoning is None without a think block.

    A block that opens the reply counts, and so does a bare `</think>` (a template that puts
    `<think>` in the generation prompt leaves only the closing tag in the generated text).
    """
    text = content or ""
    if "</think>" not in text or not (text.lstrip().startswith("<think>") or "<think>" not in text):
        return None, text
    found = _THINK.match(text)
    if found is None:
        return None, text
    return found.group(1), text[found.end() :]


def _key(visible: str, calls: list[tuple[str, Any]]) -> str:
    return json.dumps([visible, [[name, arguments_of(args)] for name, args in calls]], sort_keys=True)


class Echoes:
    """The content behind each visible reply of one rollout (only replies that had reasoning)."""

    def __init__(self) -> None:
        self._content: dict[str, str] = {}
        self._guard = threading.Lock()

    def remember(self, visible: str, calls: list[tuple[str, Any]], content: str) -> None:
        """Note that the reply shown as `visible` + `calls` was generated as `content`."""
        with self._guard:
            self._content[_key(visible, calls)] = content

    def content(self, visible: str, calls: list[tuple[str, Any]], reasoning: str | None) -> str:
        """The assistant content an echoed turn stands for (see the module docstring)."""
        with self._guard:
            found = self._content.get(_key(visible, calls))
        if found is not None:
            return found
        return f"<think>{reasoning}</think>\n\n{visible}" if reasoning else visible
