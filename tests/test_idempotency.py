"""Idempotent submissions over real HTTP: same key + same body is the same job with the same
rollout ids in the same order; the same key with another body is a 409 naming the difference."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from core.settings import Settings
from tests.test_api import serve


@pytest.fixture
def api(any_db_url, tmp_path):
    """A gateway without workers (rollouts stay queued) on SQLite or PostgreSQL."""
    settings = Settings(home=tmp_path, database_url=any_db_url, handler_modules="bench.support.pipeline_handlers")
    server, client = serve(settings)
    yield client
    client.close()
    server.shutdown()


def job(**over):
    # instance ids deliberately not in sorted order: the ids must follow the request
    body = {
        "agent": "test-trivial",
        "n_samples": 2,
        "idempotency_key": "k",
        "instances": [{"instance_id": "c", "data": {"x": 1}}, {"instance_id": "a"}, {"instance_id": "b"}],
    }
    body.update(over)
    return body


def test_replay_gives_the_same_ids_in_the_same_order(api):
    first = api.post("/v1/jobs", json=job())
    assert first.status_code == 202 and first.json()["created"]
    ids = first.json()["rollout_ids"]
    order = [
        (api.get(f"/v1/rollouts/{r}").json()["instance_id"], api.get(f"/v1/rollouts/{r}").json()["sample_index"])
        for r in ids
    ]
    assert order == [("c", 0), ("c", 1), ("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    for body in (job(), job(sampling={}), job(limits={})):  # defaults spelled out: same body
        again = api.post("/v1/jobs", json=body)
        assert again.status_code == 202, again.text
        assert again.json() == {"job_id": first.json()["job_id"], "rollout_ids": ids, "created": False}
    assert len(api.get("/v1/jobs").json()["jobs"]) == 1


@pytest.mark.parametrize(
    "change, needles",
    [
        ({"n_samples": 3}, ["n_samples 3 (the job has 2)"]),
        ({"agent": "test-sleep"}, ["agent 'test-sleep' (the job has 'test-trivial')"]),
        ({"sampling": {"temperature": 0.5}}, ["sampling"]),
        (
            {"instances": [{"instance_id": "c", "data": {"x": 2}}, {"instance_id": "a"}, {"instance_id": "b"}]},
            ["data of 'c'"],
        ),
        (
            {"instances": [{"instance_id": "c", "data": {"x": 1}}, {"instance_id": "a"}, {"instance_id": "d"}]},
            ["new: 'd'", "missing: 'b'"],
        ),
        (
            {"instances": [{"instance_id": "a"}, {"instance_id": "c", "data": {"x": 1}}, {"instance_id": "b"}]},
            ["another order"],
        ),
    ],
)
def test_same_key_other_body_is_409_naming_the_difference(api, change, needles):
    first = api.post("/v1/jobs", json=job()).json()
    resp = api.post("/v1/jobs", json=job(**change))
    assert resp.status_code == 409, resp.text
    body = resp.json()
    assert body["error"] == "conflict" and "idempotency_key 'k'" in body["message"]
    assert first["job_id"] in body["message"]
    for needle in needles:
        assert needle in body["message"], body["message"]
    assert body["details"]["fields"] == [next(iter(change))]
    assert len(api.get("/v1/jobs").json()["jobs"]) == 1  # nothing new was made


def test_job_from_before_digests_still_replays(api, tmp_path, any_db_url):
    first = api.post("/v1/jobs", json=job()).json()
    engine = sa.create_engine(any_db_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE jobs SET request_digest = NULL"))
    engine.dispose()
    again = api.post("/v1/jobs", json=job()).json()
    assert again["job_id"] == first["job_id"] and again["rollout_ids"] == first["rollout_ids"]
