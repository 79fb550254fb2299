"""Which owners count as admins for the workers' URL checks (`core.owners`): the database's
answer, kept `ADMIN_TTL_SECONDS` per process (a RUN asks for every rollout it starts)."""

from __future__ import annotations

from core import owners
from core.db import session_scope
from core.models import ApiToken
from core.settings import Settings
from migrations.runner import upgrade


def test_a_token_change_reaches_the_answer_within_the_ttl(tmp_path, monkeypatch) -> None:
    settings = Settings(home=tmp_path)
    upgrade(settings.db_url)
    clock = [1000.0]
    monkeypatch.setattr(owners.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(owners, "_admin_answers", {})
    assert owners.owner_is_admin(settings, "default")  # no token at all: the local owner
    assert owners.url_rules_for(settings, "default") is None
    with session_scope(settings.db_url) as s:
        s.add(ApiToken(id="a" * 64, owner="tenant", admin=False))
    clock[0] += owners.ADMIN_TTL_SECONDS / 2
    assert owners.owner_is_admin(settings, "default")  # the kept answer, within the TTL
    clock[0] += owners.ADMIN_TTL_SECONDS
    assert not owners.owner_is_admin(settings, "default")  # a token exists now: read again
    assert owners.url_rules_for(settings, "default") == settings.policy.llm.server_rules
    assert not owners.owner_is_admin(settings, "tenant")
    with session_scope(settings.db_url) as s:
        s.get(ApiToken, "a" * 64).admin = True
    clock[0] += owners.ADMIN_TTL_SECONDS
    assert owners.owner_is_admin(settings, "tenant")
