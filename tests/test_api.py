"""REST API over real HTTP: validation errors, idempotency, servers, health, metrics, OpenAPI."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from werkzeug.serving import make_server

from app import create_app
from core.settings import Settings
from migrations.runner import upgrade


def serve(settings: Settings):
    upgrade(settings.db_url)
    app = create_app(settings)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, httpx.Client(base_url=f"http://127.0.0.1:{server.server_port}", timeout=30)


@pytest.fixture
def api(tmp_path):
    """A gateway (no workers: submissions stay queued) on SQLite + the embedded Redis."""
    settings = Settings(home=tmp_path, handler_modules="bench.support.pipeline_handlers", max_body_bytes=200_000)
    server, client = serve(settings)
    yield client
    client.close()
    server.shutdown()


def job(**over):
    body = {"agent": "test-trivial", "instances": [{"instance_id": "a"}, {"instance_id": "b"}], "n_samples": 2}
    body.update(over)
    return body


@pytest.mark.parametrize(
    "body, status, needle",
    [
        (job(agent="nope"), 400, "unknown agent 'nope'; valid agents: "),
        (job(instances=[]), 400, "instances"),
        (job(n_samples=0), 400, "n_samples"),
        (job(bogus=1), 400, "bogus"),
        (job(sampling={"temperature": -1}), 400, "sampling.temperature"),
        (job(sampling={"temprature": 1}), 400, "sampling.temprature"),
        (job(limits={"max_turns": 0}), 400, "limits.max_turns"),
        (job(sandbox={"runtime": "docker"}), 400, "sandbox.runtime"),
        (job(sandbox={"binds": [{"host": "/root"}]}), 400, "sandbox.binds"),
        (job(instances=[{"instance_id": "a"}, {"instance_id": "a"}]), 400, "duplicate instance_id"),
        (job(agent="test-needs-llm"), 400, "no LLM server is registered"),  # no spec, no server
        (job(agent="test-needs-llm", llm={"tokenizer": "/nonexistent/tok"}), 400, "llm.tokenizer"),
        (job(agent_config={"x": 1}), 400, "agent_config"),
        ([1, 2], 400, "body"),
    ],
)
def test_bad_submissions_name_the_problem(api, body, status, needle):
    resp = api.post("/v1/jobs", json=body)
    assert resp.status_code == status, resp.text
    err = resp.json()
    assert needle in err["message"], err
    assert err["error"] in ("invalid_request", "config_error")


def test_unknown_agent_lists_valid_ones(api):
    from agents.registry import handler_names

    resp = api.post("/v1/jobs", json=job(agent="nope"))
    err = resp.json()
    assert resp.status_code == 400 and err["error"] == "invalid_request", err
    assert err["details"]["valid"] == handler_names() and "test-trivial" in handler_names()
    assert "'nope'" in err["message"] and all(name in err["message"] for name in handler_names())


def test_not_json_oversized_and_unknown_routes(api):
    resp = api.post("/v1/jobs", content=b"{not json", headers={"Content-Type": "application/json"})
    assert resp.status_code == 400 and resp.json()["error"] == "invalid_request"
    big = job(instances=[{"instance_id": f"i{k}", "data": {"pad": "x" * 1000}} for k in range(300)])
    resp = api.post("/v1/jobs", json=big)
    assert resp.status_code == 413 and resp.json()["error"] == "payload_too_large"
    assert api.get("/v1/nothing").status_code == 404
    assert api.get("/v1/nothing").json()["error"] == "not_found"
    assert api.delete("/v1/jobs").status_code == 405
    assert api.get("/v1/jobs/doesnotexist").json()["error"] == "not_found"
    assert api.get("/v1/rollouts/doesnotexist").status_code == 404
    assert api.get("/v1/jobs/doesnotexist/results").status_code == 404


def test_runtime_and_backend_as_name_or_typed_config(api, tmp_path):
    """Today's wire (`"bwrap"`, `"vllm"`) and the typed config (`{"type": ...}`) are both
    accepted and stored as the name; an unknown type lists the valid runtimes."""
    from core.db import session_scope
    from core.models import Job

    db_url = Settings(home=tmp_path).db_url  # the api fixture's database
    for runtime, backend in (("bwrap", "vllm"), ({"type": "bwrap"}, {"type": "vllm"})):
        body = job(sandbox={"runtime": runtime}, llm={"servers": [{"url": "http://127.0.0.1:9"}], "backend": backend})
        resp = api.post("/v1/jobs", json=body)
        assert resp.status_code == 202, resp.text
        with session_scope(db_url) as session:
            config = session.get(Job, resp.json()["job_id"]).config
        assert config["sandbox"]["runtime"] == "bwrap" and config["llm"]["backend"] == "vllm"
    resp = api.post("/v1/jobs", json=job(sandbox={"runtime": {"type": "docker"}}))
    assert resp.status_code == 400 and "sandbox.runtime" in resp.text, resp.text
    assert "valid: bwrap, local, singularity" in resp.json()["message"]


def test_submission_accepted_and_idempotent(api):
    first = api.post("/v1/jobs", json=job(idempotency_key="k1"))
    assert first.status_code == 202
    body = first.json()
    assert body["created"] and len(body["rollout_ids"]) == 4
    again = api.post("/v1/jobs", json=job(idempotency_key="k1")).json()
    assert again["job_id"] == body["job_id"] and not again["created"]
    assert again["rollout_ids"] == body["rollout_ids"]  # same order (tests/test_idempotency.py)
    other = api.post("/v1/jobs", json=job(idempotency_key="k2")).json()
    assert other["job_id"] != body["job_id"]
    view = api.get(f"/v1/jobs/{body['job_id']}").json()
    assert view["n_rollouts"] == 4 and view["counts"] == {"pending": 4}
    assert view["status"] == "running" and view["progress"] == 0
    listing = api.get("/v1/jobs", params={"limit": 1}).json()
    assert len(listing["jobs"]) == 1 and listing["next_cursor"]
    nxt = api.get("/v1/jobs", params={"limit": 5, "before": listing["next_cursor"]}).json()
    assert {j["job_id"] for j in nxt["jobs"]} | {listing["jobs"][0]["job_id"]} == {body["job_id"], other["job_id"]}


def test_results_query_validation_and_empty_long_poll(api):
    job_id = api.post("/v1/jobs", json=job()).json()["job_id"]
    assert api.get(f"/v1/jobs/{job_id}/results", params={"after": "x"}).status_code == 400
    assert api.get(f"/v1/jobs/{job_id}/results", params={"wait": 10_000}).status_code == 400
    page = api.get(f"/v1/jobs/{job_id}/results", params={"wait": 0.5}).json()
    assert page == {"job_id": job_id, "items": [], "cursor": 0, "done": False}


def test_cancel_of_queued_job_finishes_every_rollout(api):
    job_id = api.post("/v1/jobs", json=job()).json()["job_id"]
    view = api.post(f"/v1/jobs/{job_id}/cancel").json()
    assert view["status"] == "cancelled" and view["outcomes"] == {"cancelled": 4}
    page = api.get(f"/v1/jobs/{job_id}/results").json()
    assert [i["seq"] for i in page["items"]] == [1, 2, 3, 4] and page["done"]
    assert sum(i["group_complete"] for i in page["items"]) == 2


def test_llm_server_crud(api):
    created = api.post("/v1/llm-servers", json={"url": "http://10.0.0.1:8000/", "weight_version": "v1"})
    assert created.status_code == 201
    sid = created.json()["id"]
    assert created.json()["url"] == "http://10.0.0.1:8000"
    dup = api.post("/v1/llm-servers", json={"url": "http://10.0.0.1:8000"})
    assert dup.status_code == 409 and "already registered" in dup.json()["message"]
    assert api.post("/v1/llm-servers", json={"url": "ftp://x"}).status_code == 400
    updated = api.put(f"/v1/llm-servers/{sid}", json={"weight_version": "v2"}).json()
    assert updated["weight_version"] == "v2"
    assert [s["id"] for s in api.get("/v1/llm-servers").json()["servers"]] == [sid]
    assert api.delete(f"/v1/llm-servers/{sid}").status_code == 200
    assert api.delete(f"/v1/llm-servers/{sid}").status_code == 404
    assert api.put("/v1/llm-servers/zzz", json={"weight_version": "v3"}).status_code == 404


def test_prorl_lifecycle_and_errors_as_prorl_answers_them(api):
    """ProRL's lifecycle: 503 before /start on /process, /status, /stop (v1 unaffected);
    errors are `{"detail": ...}`; a body missing a field is 422; /add_llm_server is idempotent."""
    ok = {
        "instance": {"data_source": "math", "problem": "1+1?", "answer": "2"},
        "sampling_params": {"temperature": 0.6},
    }
    for early in (api.post("/process", json=ok), api.get("/status"), api.post("/stop")):
        assert early.status_code == 503, early.text
        assert early.json() == {"detail": "Server is not running. Please start the server first."}
    assert api.get("/v1/jobs").status_code == 200  # the v1 API never waits for /start
    assert api.post("/start").json() == {"status": "Server started successfully"}
    again = api.post("/start")
    assert again.status_code == 400 and again.json() == {"detail": "Server is already running"}
    first = api.post("/add_llm_server", json={"address": "10.0.0.2:8000"})
    assert first.status_code == 200 and first.json()["added"] == "http://10.0.0.2:8000"
    # NeMo RL treats any non-200 as fatal: a known address is fine, as in ProRL
    assert api.post("/add_llm_server", json={"address": "http://10.0.0.2:8000/v1"}).status_code == 200
    status = api.get("/status").json()
    assert status["status"] == "running" and status["pending_jobs"] == 0
    assert [s["address"] for s in status["llm_servers"]] == ["http://10.0.0.2:8000"]
    missing = api.post("/process", json={"instance": {"data_source": "math"}})
    assert missing.status_code == 422
    assert missing.json()["detail"][0]["loc"] == ["body", "sampling_params"]
    unknown_key = api.post("/process", json={**ok, "sampling_params": {"temprature": 0.6}})
    assert unknown_key.status_code == 400
    detail = unknown_key.json()["detail"]
    assert "'temprature'" in detail and "temperature" in detail and "max_output_tokens" in detail
    negative = api.post("/process", json={**ok, "sampling_params": {"temperature": -1}})
    assert negative.status_code == 422
    assert negative.json()["detail"][0]["loc"] == ["body", "sampling_params", "temperature"]
    unknown = api.post("/process", json={"instance": {"data_source": "nope"}, "sampling_params": {}})
    assert unknown.status_code == 400 and "unknown agent 'nope'" in unknown.json()["detail"]
    # no data_source = ProRL's default dataset (SWE-bench): the swe agent validates the instance
    bad_swe = api.post("/process", json={"instance": {"instance_id": "x"}, "sampling_params": {}})
    assert bad_swe.status_code == 400 and "repo" in bad_swe.json()["detail"]
    huge = api.post("/process", content=b"{" + b" " * 300_000 + b"}", headers={"Content-Type": "application/json"})
    assert huge.status_code == 413 and "detail" in huge.json()
    cancel = api.post("/cancel", json={"job_id": "nope"})
    assert cancel.status_code == 200 and cancel.json()["status"] == "Cancel requested for job nope"
    assert api.post("/clear_llm_server").json()["removed"] == 1
    assert api.post("/stop").json()["status"] == "Server stopped successfully"
    assert api.get("/status").status_code == 503


def test_health_metrics_openapi(api):
    assert api.get("/healthz").json() == {"ok": True}
    ready = api.get("/readyz")  # no worker pool runs in this test: not ready, and it says why
    assert ready.status_code == 503 and ready.json()["broker"] == "ok"
    assert ready.json()["stages"] == {"init": 0}
    assert ready.json()["workers"] == "error: no worker consumes init"
    api.post("/v1/jobs", json=job())
    deadline = time.monotonic() + 30  # published just after the 202, by the outbox thread
    while "raas_outbox_rollouts 0.0" not in (text := api.get("/metrics").text):
        assert time.monotonic() < deadline, text
        time.sleep(0.05)
    text = api.get("/metrics").text  # queue depths of a scrape that began after the publish
    assert 'raas_queue_depth{queue="raas.unrouted"} 0.0' in text
    assert 'raas_queue_depth{queue="init"} 4.0' in text
    assert 'raas_rollouts{outcome="",status="pending"} 4.0' in text
    assert "raas_stage_run_seconds_bucket" in text
    doc = api.get("/openapi.json").json()
    post = doc["paths"]["/v1/jobs"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("JobCreate")
    assert "JobCreate" in doc["components"]["schemas"] and "/process" in doc["paths"]
    assert "{job_id}" in "".join(doc["paths"])


def test_readyz_names_the_unreachable_broker(tmp_path):
    settings = Settings(home=tmp_path, broker_url="redis://127.0.0.1:1/0")
    server, client = serve(settings)
    try:
        resp = client.get("/readyz")
        assert resp.status_code == 503
        assert resp.json()["database"] == "ok" and resp.json()["broker"].startswith("error")
    finally:
        server.shutdown()


def test_bearer_token(tmp_path):
    server, client = serve(Settings(home=tmp_path, api_token="s3cret-token"))
    try:
        assert client.get("/v1/jobs").status_code == 401
        assert client.get("/v1/jobs", headers={"Authorization": "Bearer s3cret-token"}).status_code == 200
        assert client.get("/healthz").status_code == 200
    finally:
        server.shutdown()


def test_prorl_started_state_is_shared_by_gateways(tmp_path):
    """Two gateways on one database (gunicorn workers, several hosts) agree on /start."""
    settings = Settings(home=tmp_path, handler_modules="bench.support.pipeline_handlers")
    (one, a), (two, b) = serve(settings), serve(settings)
    try:
        assert b.get("/status").status_code == 503
        assert a.post("/start").status_code == 200
        assert b.get("/status").status_code == 200 and b.post("/start").status_code == 400
        assert b.post("/stop").status_code == 200 and a.get("/status").status_code == 503
    finally:
        for server, client in ((one, a), (two, b)):
            client.close()
            server.shutdown()


def test_sdk_takes_flat_rows_like_the_cli(api, tmp_path):
    from raas_client import RaasClient
    from core.db import session_scope
    from core.models import Rollout

    with RaasClient(str(api.base_url)) as sdk:
        flat = sdk.submit("test-trivial", [{"instance_id": "p1", "problem": "2+3", "answer": 5}])
        wrapped = sdk.submit("test-trivial", [{"instance_id": "p1", "data": {"problem": "2+3", "answer": 5}}])
    [a], [b] = flat.rollout_ids, wrapped.rollout_ids
    with session_scope(Settings(home=tmp_path).db_url) as s:
        assert s.get(Rollout, a).instance == s.get(Rollout, b).instance == {"problem": "2+3", "answer": 5}
