"""Checks of instance fields that several handlers share (a question, a problem, an answer):
a bad value is a 400 naming `instance.<key>`, with the same wording whichever handler asks."""

from __future__ import annotations

from typing import Any

from core.errors import InvalidRequest


def require_text(instance: dict[str, Any], key: str, *, numbers_ok: bool = False, max_chars: int | None = None) -> None:
    """Raise InvalidRequest naming `instance.<key>` unless it is a non-empty string (or a
    number, with `numbers_ok`) of at most `max_chars` characters."""
    value = instance.get(key)
    ok_types = (str, int, float) if numbers_ok else (str,)
    if (
        isinstance(value, bool)
        or not isinstance(value, ok_types)
        or not str(value).strip()
        or (max_chars is not None and len(str(value)) > max_chars)
    ):
        kind = "a non-empty string or a number" if numbers_ok else "a non-empty string"
        limit = f" of at most {max_chars} characters" if max_chars is not None else ""
        raise InvalidRequest(f"instance.{key} must be {kind}{limit}", field=f"instance.{key}")
