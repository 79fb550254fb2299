"""JSON columns read by `core.json_columns.loads`: orjson's speed, the stdlib's answers.

A value must come back as it went in: the same types (an integer stays an integer at any
size) and the same values as `json.loads` gives, on every text a database hands back."""

from __future__ import annotations

import json
import math
import random

import pytest

from core.json_columns import dumps_bytes, loads

EDGES = [
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    2**64,  # orjson alone reads these two as floats
    -(2**63) - 1,
    2**70,
    10**18,
    -(10**18),
    0.1,
    1e308,
    -0.0,
    "9999999999999999999999 in a string",
    "\u00e9\u4e2d\U0001f600",
    {"3": [1, 2.5, None, True, False, ""]},
]


def _same(a: object, b: object) -> bool:
    """Equal with the same types all the way down (1 and 1.0 differ here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


@pytest.mark.parametrize("value", EDGES, ids=repr)
def test_an_edge_reads_as_the_stdlib_reads_it(value: object) -> None:
    text = json.dumps(value)
    for given in (text, text.encode(), memoryview(text.encode()), bytearray(text.encode())):
        assert _same(loads(given), json.loads(text))


@pytest.mark.parametrize(
    "text",
    [
        "NaN",
        "[Infinity, -Infinity]",
        "[1e400]",
        '"\\ud800"',
        '{"a": 1, "a": 2}',
        "[0.12345678901234567890123, -1234567890123456789012e-3]",  # long digit runs in floats
    ],
)
def test_texts_on_the_stdlib_path_read_as_it_reads_them(text: str) -> None:
    assert _same(loads(text), json.loads(text))


def test_malformed_json_raises_the_stdlib_error() -> None:
    with pytest.raises(json.JSONDecodeError):
        loads(b'{"a": ')


def _random_value(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return rng.choice([rng.randrange(-1000, 1000), rng.randrange(-(2**80), 2**80), 2 ** rng.randrange(90)])
    if kind == 1:
        return rng.uniform(-1e6, 1e6) * 10 ** rng.randrange(-300, 300)
    if kind == 2:
        return "".join(rng.choice('ab7\u00e9"\\\n\U0001f600') for _ in range(rng.randrange(12)))
    if kind == 3:
        return rng.choice([None, True, False])
    if kind in (4, 5):
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(6))]
    return {str(rng.randrange(100)): _random_value(rng, depth + 1) for _ in range(rng.randrange(6))}


def test_random_documents_read_as_the_stdlib_reads_them() -> None:
    rng = random.Random(25)
    for _ in range(2000):
        text = json.dumps(_random_value(rng))
        assert _same(loads(text.encode()), json.loads(text)), text


def test_what_is_written_reads_back() -> None:
    logprobs = [-0.5, -9999.0, -1e-12]
    row = {"response_ids": list(range(50)), "logprobs": logprobs, "seed": 2**70, "nan": math.nan}
    assert _same(loads(dumps_bytes(row)), {**row, "nan": None})
