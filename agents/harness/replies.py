"""What a harness is answered from one generation, as the real API would answer it.

The generated ids are recorded whole (they are what the policy sampled); only the *text*
returned is shaped here: cut before the stop string that ended the turn (an API's output never
contains it), its leading `<think>...</think>` split off as reasoning when the request asked
for thinking, and the per-token logprobs when the request asked for them.
"""

from __future__ import annotations

import re
from typing import Any

_THINK = re.compile(r"^\s*(?:<think>)?(.*?)</think>\s*", re.DOTALL)


def cut_at_stop(text: str, stop: list[str], matched: Any = None) -> tuple[str, str | None]:
    """(the text before the stop string that ended it, that string) or (text, None).

    The server names the string it matched (vLLM's `stop_reason`); without that (another
    server, a text backend that does not stop) the string whose match ends first wins, which is
    where a server checking after every token would have stopped.
    """
    if isinstance(matched, str) and matched and matched in text:
        return text[: text.find(matched)], matched
    best: tuple[int, int, str] | None = None
    for s in stop:
        at = text.find(s) if s else -1
        if at >= 0 and (best is None or at + len(s) < best[0]):
            best = (at + len(s), at, s)
    return (text, None) if best is None else (text[: best[1]], best[2])


def split_thinking(text: str) -> tuple[str | None, str]:
    """(reasoning, the rest) when the text opens with a `<think>` block (or ends one the
    generation prompt opened); (None, text) otherwise."""
    found = _THINK.match(text)
    if found is None:
        return None, text
    return found.group(1).strip(), text[found.end() :]


def token_logprobs(tok: Any, ids: list[int], logprobs: list[float] | None) -> list[tuple[str, float]]:
    """(token text, logprob) of every generated token: what `logprobs: true` answers."""
    values = list(logprobs or [0.0] * len(ids))
    return [(tok.hf.decode([i]), float(lp)) for i, lp in zip(ids, values)]
