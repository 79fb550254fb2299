"""Which owners hold the admin role, for code that has an owner but no token (workers, reaper).

A tenant's inference-server URLs were accepted against the operator's URL rules; an admin's
were accepted as they are. Workers hold a job's or a pool's URLs to those rules at every
connection (`agents.llm.backends.guard`) unless the owner is an admin: an owner counts as one
when any of its tokens is (settings or `raas token add --admin`), or when no token exists at
all (the single local owner of a service without auth).
"""

from __future__ import annotations

import threading
import time

from sqlalchemy import bindparam, exists, select

from core.db import session_scope
from core.models import ApiToken
from core.policy import DEFAULT_OWNER
from core.settings import Settings
from core.urls import UrlRule


# A RUN asks for every rollout it starts, and the answer moves only when an operator adds or
# removes a token: each process keeps it this long (the query was ~4 % of a RUN worker's CPU,
# `bench/hot_path.py`). A token change reaches the workers' URL checks within it; the gateway,
# which accepted the job's URLs, checks the token itself on every request.
ADMIN_TTL_SECONDS = 2.0
_admin_answers: dict[tuple[str, str], tuple[float, bool]] = {}
_admin_lock = threading.Lock()


def owner_is_admin(settings: Settings, owner: str) -> bool:
    """True when `owner` may name any URL (see the module docstring)."""
    if owner == DEFAULT_OWNER and settings.api_token is not None:
        return True
    if any(g.owner == owner and g.admin for g in settings.api_tokens.values()):
        return True
    key, now = (settings.db_url, owner), time.monotonic()
    with _admin_lock:
        known = _admin_answers.get(key)
    if known is not None and now - known[0] < ADMIN_TTL_SECONDS:
        return known[1]
    with session_scope(settings.db_url) as s:
        admin, any_token = s.execute(_ADMIN_OR_ANY_TOKEN, {"owner": owner}).one()
    answer = bool(admin) or (not any_token and not settings.auth_configured and owner == DEFAULT_OWNER)
    with _admin_lock:
        _admin_answers[key] = (now, answer)
    return answer


# Both questions in one statement, built once: a RUN asks it for every rollout it starts.
_ADMIN_OR_ANY_TOKEN = select(
    exists().where(ApiToken.owner == bindparam("owner"), ApiToken.admin.is_(True)),
    exists().where(ApiToken.id.is_not(None)),
)


def url_rules_for(settings: Settings, owner: str) -> list[UrlRule] | None:
    """The URL rules `owner`'s server calls are held to (None: an admin, any URL)."""
    return None if owner_is_admin(settings, owner) else settings.policy.llm.server_rules
