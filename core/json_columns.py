"""How JSON columns are written: orjson, with one rule for what JSON cannot hold.

Every turn row carries seven JSON columns (token ids, logprobs, tool calls, observation,
the loop's state) and a hand-on to EVAL the whole trajectory; the stdlib encoder (through
psycopg's JSONB dumper) cost a RUN worker ~0.25 ms per turn insert, orjson ~0.02 ms
(`bench/hot_path.py`, BENCHMARKS "Hot path, round 6").

What changes with it, on both databases alike:
- A non-finite float (NaN, Infinity) is stored as null. JSON has no such values: PostgreSQL's
  JSONB refused the row (a turn with a `-Infinity` logprob crashed its write) while SQLite
  stored a token no JSON parser reads. Logprobs never get here non-finite: the backends clamp
  them (`agents.llm.backends.abstract.finite_logprobs`).
- An integer past 64 bits, which orjson refuses, is written by the stdlib encoder as before.

Reading stays on the stdlib decoder: orjson reads an integer past 64 bits as a float, and a
stored value must come back as it went in.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

_OPTIONS = orjson.OPT_NON_STR_KEYS  # int keys become strings, as json.dumps writes them


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
