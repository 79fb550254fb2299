"""Dashboard sessions on the server (`ui_sessions`): the cookie carries a random id only.

Before issue 22.8 the signed (not encrypted) cookie held the API token itself: base64 gave a
bearer token valid on /v1. Now a login stores a row keyed by the SHA-256 of a fresh random id,
with the SHA-256 of the token it logged in with and its own CSRF token; the cookie holds the
random id. Every request resolves the token digest again (a removed token ends its sessions),
logout deletes the row, and a row expires after `ui_session_hours`.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import delete

from app.auth import Principal, resolve_digest, token_digest
from core.db import session_scope
from core.models import UISession, utcnow
from core.settings import Settings


@dataclass(frozen=True)
class Session:
    """A live dashboard session: who it speaks for and its form token."""

    principal: Principal
    csrf: str


def _key(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def create(settings: Settings, token: str) -> tuple[str, str]:
    """A new session for `token` (already accepted); returns (cookie id, csrf token)."""
    session_id, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
    now = utcnow()
    with session_scope(settings.db_url) as s:
        s.execute(delete(UISession).where(UISession.expires_at < now))  # sweep old ones
        s.add(
            UISession(
                id=_key(session_id),
                token_digest=token_digest(token),
                csrf=csrf,
                created_at=now,
                expires_at=now + timedelta(hours=settings.ui_session_hours),
            )
        )
    return session_id, csrf


def lookup(settings: Settings, session_id: str) -> Session | None:
    """The live session of a cookie id, or None (unknown, expired or its token removed)."""
    with session_scope(settings.db_url) as s:
        row = s.get(UISession, _key(session_id))
        if row is None or _aware(row.expires_at) < utcnow():
            return None
        digest, csrf = row.token_digest, row.csrf
    principal = resolve_digest(settings, digest)
    return Session(principal, csrf) if principal is not None else None


def end(settings: Settings, session_id: str) -> None:
    """Forget a session (logout)."""
    with session_scope(settings.db_url) as s:
        s.execute(delete(UISession).where(UISession.id == _key(session_id)))


def _aware(value):  # untyped: SQLite returns naive UTC datetimes
    from datetime import timezone

    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
