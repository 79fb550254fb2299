"""The endpoint's own header parse (`http_server.read_headers`) gives what the stdlib's
`http.client.parse_headers` gives, on the headers real harnesses send (the recorded requests in
tests/fixtures/harness-requests) and on the odd cases, and refuses what the stdlib refuses."""

from __future__ import annotations

import http.client
import io
import json
from pathlib import Path

import pytest

from agents.harness.http_server import MALFORMED, read_headers

RECORDED = sorted((Path(__file__).resolve().parent.parent / "fixtures" / "harness-requests").glob("*.json"))


def _block(pairs: list[tuple[str, str]]) -> bytes:
    return "".join(f"{k}: {v}\r\n" for k, v in pairs).encode("iso-8859-1") + b"\r\n"


def _both(raw: bytes) -> tuple[list, list]:
    ours = read_headers(io.BytesIO(raw + b"BODY"))
    assert not isinstance(ours, str)
    theirs = http.client.parse_headers(io.BytesIO(raw + b"BODY"))
    return ours.items(), theirs.items()


@pytest.mark.parametrize("recorded", RECORDED, ids=[p.stem for p in RECORDED])
def test_recorded_harness_headers_parse_as_the_stdlib_parses_them(recorded: Path) -> None:
    headers = json.loads(recorded.read_text())["headers"]
    ours, theirs = _both(_block(list(headers.items())))
    assert ours == theirs and len(ours) == len(headers)


def test_odd_headers_parse_as_the_stdlib_parses_them() -> None:
    raw = b"Host: x\r\nX-Empty:\r\nX-Spaces:   a b  \r\nX-Tab:\tv\r\nX-Dup: 1\r\nx-dup: 2\r\nX-Colon: a:b\r\n"
    raw += b"X-Folded: one\r\n two\r\nX-Latin: caf\xe9\r\n\r\n"
    ours, theirs = _both(raw)
    assert ours == theirs
    message = read_headers(io.BytesIO(raw))
    assert message.get_all("x-dup") == ["1", "2"] and message.get("x-latin") == "café"
    ours, theirs = _both(b"Host: x\n\n")  # bare newlines
    assert ours == theirs == [("Host", "x")]


def test_refuses_what_the_stdlib_refuses() -> None:
    too_many = _block([(f"X-{i}", "v") for i in range(http.client._MAXHEADERS + 1)])
    assert read_headers(io.BytesIO(too_many)) == "Too many headers"
    with pytest.raises(http.client.HTTPException):
        http.client.parse_headers(io.BytesIO(too_many))
    long_line = b"X-Long: " + b"a" * http.client._MAXLINE + b"\r\n\r\n"
    assert read_headers(io.BytesIO(long_line)) == "Line too long"
    assert read_headers(io.BytesIO(b"no colon here\r\n\r\n")) == MALFORMED
