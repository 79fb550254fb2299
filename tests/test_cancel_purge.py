"""The cancel's broker purge (`tasks.broker.purge`) on a real Redis, embedded and TCP: it removes
exactly the cancelled job's first-attempt INIT messages from every priority list, keeps
everything else in its order, and loses nothing when a consumer and a publisher work the
same list while it scans."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
import redis

from core.settings import Settings
from tasks.broker import purge
from tasks.celery_app import make_celery
from tasks.broker.publish import publish, publish_reevaluation_message
from tasks.broker.queues import queue_depths
from tests.conftest import REDIS_URL

JOB, OTHER = "job-a", "job-a2"  # OTHER contains JOB: the prefilter alone must not decide


@pytest.fixture(params=["embedded", "redis"])
def celery(request, tmp_path) -> Any:
    """A Celery app on the embedded Redis (Unix socket) or the machine's Redis (key prefix)."""
    if request.param == "embedded":
        settings = Settings(home=tmp_path)
    else:
        settings = Settings(
            home=tmp_path, broker_url=REDIS_URL, broker_key_prefix=request.getfixturevalue("redis_prefix")
        )
    app = make_celery(settings)
    yield app
    app.close()


def _client(app: Any) -> tuple[redis.Redis, list[str]]:
    """A plain client and the INIT queue's priority lists (prefixed) of the app's broker."""
    with app.connection_for_write() as conn:
        ch = conn.default_channel
        keys = [ch.global_keyprefix + ch._q_for_pri("init", p) for p in ch.priority_steps]
        return redis.Redis(connection_pool=ch.pool), list(dict.fromkeys(keys))


def _messages(client: redis.Redis, keys: list[str]) -> list[tuple[str, str, Any, Any]]:
    """(list, task, args, job header) of every queued message, left to right per list."""
    out = []
    for key in keys:
        for raw in client.lrange(key, 0, -1):
            h = json.loads(raw)["headers"]
            out.append((key, h["task"], h["argsrepr"], h.get("raas_job")))
    return out


def test_purge_removes_only_the_cancelled_jobs_first_attempt_inits(celery):
    with celery.producer_or_acquire() as producer:
        for k in range(40):
            publish(celery, "init", f"a{k}", 1, producer=producer, priority=k % 3, job=JOB)
            if k % 4 == 0:
                publish(celery, "init", f"o{k}", 1, producer=producer, priority=k % 3, job=OTHER)
        publish(celery, "init", "a-retry", 2, producer=producer, job=JOB)  # a retry: claimed, ends cancelled
        publish(celery, "init", "no-job", 1, producer=producer)  # published without the job id
        publish(celery, "run", "a-run", 1, "n1", producer=producer, job=JOB)  # holds a sandbox
    publish_reevaluation_message(celery, "a0", "req-1")
    client, keys = _client(celery)
    before = _messages(client, keys)
    assert sum(1 for m in before if m[3] == JOB) == 41

    removed = purge.purge_job(celery, JOB, chunk=7)  # many chunks per list

    assert removed == 40
    after = _messages(client, keys)
    assert after == [m for m in before if not (m[3] == JOB and m[2].endswith(", 1]"))]
    assert {m[2] for m in after if m[3] == JOB} == {"['a-retry', 2]"}
    assert sum(1 for m in after if m[3] == OTHER) == 10
    assert any(m[1] == "raas.reevaluate" for m in after)
    assert queue_depths(celery, ["run.n1"]) == {"run.n1": 1}
    assert purge.purge_job(celery, JOB) == 0  # nothing left: a second purge is a no-op


def test_purge_racing_a_consumer_and_a_publisher_loses_nothing(celery):
    n = 3000
    with celery.producer_or_acquire() as producer, producer.batch(max_size=500):
        for k in range(n):
            publish(celery, "init", f"a{k}", 1, producer=producer, job=JOB if k % 3 else OTHER)
    client, keys = _client(celery)
    key = next(k for k in keys if client.llen(k))
    taken: list[bytes] = []
    stop = threading.Event()

    def consume() -> None:  # a worker: takes from the right end, as BRPOP does
        while not stop.is_set():
            item = client.rpop(key)
            if item:
                taken.append(item)

    def produce() -> None:  # a publisher pushing later messages on the left meanwhile
        for k in range(300):
            publish(celery, "init", f"late{k}", 1, job=OTHER)

    threads = [threading.Thread(target=consume), threading.Thread(target=produce)]
    for t in threads:
        t.start()
    removed = purge.purge_job(celery, JOB, chunk=50)
    threads[1].join()
    stop.set()
    threads[0].join()
    left = [json.loads(raw)["headers"] for raw in client.lrange(key, 0, -1)]
    taken_h = [json.loads(raw)["headers"] for raw in taken]
    seen = [h["argsrepr"] for h in taken_h + left]
    assert len(seen) == len(set(seen))  # no message twice
    other = {h["argsrepr"] for h in taken_h + left if h["raas_job"] == OTHER}
    assert len(other) == n // 3 + 300  # no message of another job removed
    jobs_left = sum(1 for h in taken_h + left if h["raas_job"] == JOB)
    assert removed > 0 and removed + jobs_left == n - n // 3  # each of the job's: removed or delivered
    assert not any(h["raas_job"] == JOB for h in left)  # the scan reached every one not taken
    assert taken  # the consumer did take messages while the scan ran


def test_a_purge_that_cannot_reach_redis_is_logged_not_raised(tmp_path, caplog):
    dead = make_celery(Settings(home=tmp_path, broker_url="redis://127.0.0.1:1/0"))
    dead.conf.broker_connection_timeout = 1.0
    assert purge.purge_quietly(dead, JOB) is None
    assert "workers drop them" in caplog.text
