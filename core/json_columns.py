"""How JSON columns are written: orjson, with one rule for what JSON cannot hold.

Every turn row carries seven JSON columns (token ids, logprobs, tool calls, observation,
the loop's state) and a hand-on to EVAL the whole trajectory; the stdlib encoder (through
psycopg's JSONB dumper) cost a RUN worker ~0.25 ms per turn insert, orjson ~0.02 ms
(`bench/hot_path.py`, docs/benchmarks-history.md, "Hot path, round 6").

What changes with it, on both databases alike:
- A non-finite float (NaN, Infinity) is stored as null. JSON has no such values: PostgreSQL's
  JSONB refused the row (a turn with a `-Infinity` logprob crashed its write) while SQLite
  stored a token no JSON parser reads. Logprobs never get here non-finite: the backends clamp
  them (`agents.llm.backends.abstract.finite_logprobs`).
- An integer past 64 bits, which orjson refuses, is written by the stdlib encoder as before.

Reading is orjson's too (`loads`; an EVAL claim decodes the whole stored trajectory, ~16 % of
an EVAL worker's CPU on the stdlib decoder), except where it would differ from the stdlib's:
orjson reads an integer past 64 bits as a float, and a stored value must come back as it went
in, so a text holding a run of 19 or more digits (every such integer has one) is read by the
stdlib decoder, as is one orjson refuses (an infinite float, a lone surrogate).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

_OPTIONS = orjson.OPT_NON_STR_KEYS  # int keys become strings, as json.dumps writes them
# An integer orjson reads exactly fits 64 bits: at most 19 digits signed, 20 unsigned (below
# 2**64). A run of 19 digits anywhere (a number, or digits inside a string) takes the stdlib.
_LONG_DIGITS = re.compile(rb"[0-9]{19}")


def dumps_bytes(value: Any) -> bytes:
    """`value` as JSON bytes (psycopg's JSON dumper takes them as they are)."""
    try:
        return orjson.dumps(value, option=_OPTIONS)
    except orjson.JSONEncodeError:  # an integer past 64 bits, or a type orjson lacks
        return json.dumps(_nulled(value)).encode()


def _nulled(value: Any) -> Any:
    """`value` with its non-finite floats as None, as orjson writes them (the rare stdlib path)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _nulled(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_nulled(item) for item in value]
    return value


def dumps_text(value: Any) -> str:
    """`value` as JSON text (SQLite stores JSON columns as TEXT)."""
    return dumps_bytes(value).decode()


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """JSON `data` as the stdlib decoder reads it: orjson where the two agree (see above)."""
    if isinstance(data, str):
        data = data.encode()
    if _LONG_DIGITS.search(data) is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # what only the stdlib reads (Infinity, NaN, 1e400, a lone surrogate)
    return json.loads(bytes(data))
