"""Issue 10: every attack a trainer's job spec or token could make, through the real gateway.

Each case was a working attack before the operator policy, the LLM spec hardening and tenants;
each now gets a clear 4xx naming the field and the rule (401/403/404 for tenant cases).
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from core.settings import Settings
from tests.llm.conftest import SMOLLM2
from tests.test_api import serve

ALICE, BOB, OPERATOR = "alice-token-0001", "bob-token-00002", "operator-token-01"
REPO = Path(__file__).resolve().parents[1]
HOME = Path.home()  # host paths a tenant might aim at: this machine's, computed, never written in


def tenant_settings(tmp_path: Path, **policy) -> Settings:
    return Settings(
        home=tmp_path,
        handler_modules="tests.pipeline_handlers",
        api_token=OPERATOR,
        api_tokens={ALICE: {"owner": "alice"}, BOB: {"owner": "bob"}},
        policy=policy or {},
    )


@pytest.fixture
def gateway(tmp_path):
    """A gateway with two tenants and an operator token; no workers (jobs stay queued)."""
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "chatml.jinja").write_text((Path(SMOLLM2) / "chat_template.jinja").read_text())
    settings = tenant_settings(
        tmp_path,
        sandbox={"env": ["MY_*"]},
        llm={
            "server_urls": ["http://[10.9.0.0/16]:*"],
            "templates_dir": str(templates),
            "inline_template_max_bytes": 20000,
            "tokenizer_roots": [str(Path(SMOLLM2).parent)],
            "credentials": {"openai": {"env": "OPENAI_KEY", "urls": ["https://api.example.com"]}},
        },
    )
    server, _ = serve(settings)
    url = f"http://127.0.0.1:{server.server_port}"
    clients = {
        name: httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {token}"})
        for name, token in (("alice", ALICE), ("bob", BOB), ("operator", OPERATOR))
    }
    clients["anon"] = httpx.Client(base_url=url, timeout=30)
    yield clients
    for client in clients.values():
        client.close()
    server.shutdown()


def job(**over):
    body = {"agent": "test-trivial", "instances": [{"instance_id": "a"}], "n_samples": 1}
    body.update(over)
    return body


def llm_job(**llm):
    return job(agent="test-needs-llm", llm={"tokenizer": SMOLLM2, **llm})


def rejected(resp: httpx.Response, status: int, *needles: str) -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    message = body.get("message") or body.get("detail")  # ProRL routes answer `detail`
    for needle in needles:
        assert needle in message, body
    return body


# -- 1. operator policy: the sandbox is the operator's, the job chooses within it -----------


@pytest.mark.parametrize(
    "sandbox, needles",
    [
        ({"runtime": "local"}, ["sandbox.runtime", "policy.sandbox.runtimes"]),
        ({"env": {"LD_PRELOAD": str(REPO.parent / "other-job" / "evil.so")}}, ["sandbox.env.LD_PRELOAD", "LD_*"]),
        ({"env": {"PYTHONPATH": "/tmp"}}, ["sandbox.env.PYTHONPATH", "PYTHON*"]),
        ({"env": {"BASH_ENV": "/tmp/x"}}, ["sandbox.env.BASH_ENV"]),
        ({"env": {"HOME": str(HOME)}}, ["sandbox.env.HOME", "policy.sandbox.env"]),
        ({"python_env": str(HOME / ".pyenv" / "versions" / "3.11.7")}, ["sandbox.python_env", "never a path"]),
        ({"image": "/"}, ["sandbox.image", "never a path"]),
        ({"image": "../../etc"}, ["sandbox.image"]),
        ({"network": True}, ["sandbox.network", "policy.sandbox.network"]),
        ({"binds": [{"host": str(HOME)}]}, ["sandbox.binds", "policy.sandbox.binds"]),
        ({"limits": {"max_procs": 10**9}}, ["sandbox.limits.max_procs", "max_limits.max_procs=4096"]),
        ({"limits": {"memory_mb": 10**9}}, ["sandbox.limits.memory_mb", "cap 16384"]),
        ({"limits": {"output_bytes": 10**12}}, ["sandbox.limits.output_bytes", "cap 1048576"]),
    ],
)
def test_sandbox_choices_outside_the_policy_are_400(gateway, sandbox, needles):
    rejected(gateway["alice"].post("/v1/jobs", json=job(sandbox=sandbox)), 400, *needles)


def test_choices_inside_the_policy_are_accepted(gateway):
    resp = gateway["alice"].post(
        "/v1/jobs",
        json=job(
            sandbox={
                "runtime": "bwrap",
                "env": {"MY_FLAG": "1"},
                "python_env": "pytest",
                "limits": {"memory_mb": 2048, "max_procs": 256},
            }
        ),
    )
    assert resp.status_code == 202, resp.text


def test_handler_python_env_from_the_job_is_a_name_too(gateway):
    body = job(agent="math", agent_config={"python_env": str(HOME / ".pyenv")})
    rejected(gateway["alice"].post("/v1/jobs", json=body), 400, "agent_config.python_env")


def test_swe_repo_must_be_inside_the_operator_repo_root(gateway):
    instance = {
        "repo": "/any/host/git/repo",
        "base_commit": "HEAD",
        "problem_statement": "x",
        "test_patch": "x",
        "FAIL_TO_PASS": ["t::a"],
        "PASS_TO_PASS": [],
    }
    body = job(agent="swe", instances=[{"instance_id": "s", "data": instance}])
    rejected(gateway["alice"].post("/v1/jobs", json=body), 400, "repo", "relative")
    instance["repo"] = "../../../etc"
    rejected(gateway["alice"].post("/v1/jobs", json=body), 400, "repo")


def test_policy_is_visible_without_secrets(gateway):
    policy = gateway["alice"].get("/v1/policy").json()
    assert policy["owner"] == "alice" and policy["admin"] is False
    assert policy["sandbox"]["runtimes"] == ["bwrap"] and policy["sandbox"]["network"] is False
    assert policy["sandbox"]["max_limits"]["memory_mb"] == 16384
    assert policy["llm"]["templates"] == ["chatml"]
    assert policy["llm"]["credentials"] == {"openai": {"urls": ["https://api.example.com"]}}
    assert "OPENAI_KEY" not in json.dumps(policy)
    assert gateway["operator"].get("/v1/policy").json()["admin"] is True
    assert "/v1/policy" in gateway["anon"].get("/openapi.json").json()["paths"]


# -- 2. the LLM spec: templates by name, credentials registered, URLs allowlisted ------------


def test_chat_template_is_never_a_host_path_and_no_existence_oracle(gateway):
    answers = set()
    for path in ("/proc/self/environ", "/etc/shadow", "/nonexistent/file"):
        body = rejected(
            gateway["alice"].post("/v1/jobs", json=llm_job(chat_template=path)),
            400,
            "llm.chat_template",
            "not a registered name",
        )
        answers.add(body["message"].replace(repr(path), "PATH"))
    assert len(answers) == 1  # the same answer whether the file exists or not


def test_tokenizer_folder_only_under_the_operator_roots_for_tenants(gateway):
    answers = set()
    for path in ("/etc", "/nonexistent/tok", str(HOME / ".cache" / "huggingface")):
        body = rejected(
            gateway["alice"].post("/v1/jobs", json=llm_job(tokenizer=path)),
            400,
            "llm.tokenizer",
            "policy.llm.tokenizer_roots",
        )
        answers.add(body["message"].replace(repr(path), "PATH"))
    assert len(answers) == 1  # no existence oracle
    assert gateway["alice"].post("/v1/jobs", json=llm_job()).status_code == 202  # under a root
    assert gateway["operator"].post("/v1/jobs", json=llm_job()).status_code == 202


def test_chat_template_by_name_or_capped_inline_text(gateway):
    ok = gateway["alice"].post("/v1/jobs", json=llm_job(chat_template="chatml"))
    assert ok.status_code == 202, ok.text
    rejected(
        gateway["alice"].post("/v1/jobs", json=llm_job(chat_template="nope")),
        400,
        "unknown chat template 'nope'",
        "chatml",
    )
    inline = (REPO / "tests/fixtures/qwen-style-template/chat_template.jinja").read_text()
    ok = gateway["alice"].post("/v1/jobs", json=llm_job(chat_template_text=inline))
    assert ok.status_code == 202, ok.text
    rejected(
        gateway["alice"].post("/v1/jobs", json=llm_job(chat_template_text="x" * 20001)),
        400,
        "llm.chat_template_text",
        "cap 20000",
    )


def test_credentials_are_never_read_from_a_variable_the_job_names(gateway):
    rejected(gateway["alice"].post("/v1/jobs", json=llm_job(api_key_env="RAAS_API_TOKEN")), 400, "llm.api_key_env")
    servers = [{"url": "http://10.9.0.1:8000"}]
    rejected(
        gateway["alice"].post("/v1/jobs", json=llm_job(servers=servers, credential="aws")),
        400,
        "unknown credential 'aws'",
    )
    rejected(
        gateway["alice"].post("/v1/jobs", json=llm_job(servers=servers, credential="openai")),
        400,
        "may not be sent to 'http://10.9.0.1:8000'",
    )


@pytest.mark.parametrize(
    "url, needle",
    [
        ("http://127.0.0.1:6379/admin?x=", "must be a base URL"),
        ("http://user:pw@10.9.0.1:8000", "must be a base URL"),
        ("http://127.0.0.1:5432", "policy.llm.server_urls"),
        ("http://169.254.169.254", "policy.llm.server_urls"),
    ],
)
def test_server_urls_outside_the_allowlist_are_400(gateway, url, needle):
    rejected(gateway["alice"].post("/v1/jobs", json=llm_job(servers=[{"url": url}])), 400, needle)
    rejected(gateway["alice"].post("/v1/llm-servers", json={"url": url}), 400, needle)


def test_inference_server_errors_are_summarised_not_echoed():
    """A server the job reached answers 403 with a secret body: the error says `HTTP 403
    Forbidden` and nothing of the body (real HTTP; the session the RUN stage uses)."""
    from agents.llm import LLMSession
    from core.errors import InvalidRequest

    class Leaky(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.send_response(403)
            self.end_headers()
            self.wfile.write(b'{"detail": "TOPSECRET internal admin panel"}')

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Leaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        spec = {"servers": [{"url": url, "model": "m"}], "tokenizer": SMOLLM2}
        with LLMSession.open(spec, {"max_tokens": 4}, "r-leak") as s:
            s.start([{"role": "user", "content": "hi"}])
            with pytest.raises(InvalidRequest) as err:
                s.generate(__import__("time").monotonic() + 10)
        assert "HTTP 403 Forbidden" in str(err.value) and "TOPSECRET" not in str(err.value)
    finally:
        server.shutdown()


# -- 3. tenants ------------------------------------------------------------------------------


def test_tokens_are_required_and_need_the_bearer_scheme(gateway):
    rejected(gateway["anon"].get("/v1/jobs"), 401, "missing bearer token")
    for header in (ALICE, f"Token {ALICE}", f"Basic {ALICE}", "Bearer", "Bearer wrong-token"):
        resp = gateway["anon"].get("/v1/jobs", headers={"Authorization": header})
        assert resp.status_code == 401, header
    assert gateway["anon"].get("/healthz").status_code == 200


@pytest.mark.parametrize("token", ["", "   ", "short", "has space in it"])
def test_empty_or_whitespace_token_is_a_configuration_error(tmp_path, token):
    with pytest.raises(ValidationError, match="api_token"):
        Settings(home=tmp_path, api_token=token)
    with pytest.raises(ValidationError, match="api_tokens"):
        Settings(home=tmp_path, api_tokens={token: {"owner": "x"}})


def test_empty_token_in_the_environment_stops_the_gateway(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "RAAS_HOME": str(tmp_path), "RAAS_API_TOKEN": "", "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, "-m", "app.ops.cli", "gateway", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0 and "api_token is empty" in run.stderr


def test_another_owners_ids_answer_404(gateway):
    alice, bob = gateway["alice"], gateway["bob"]
    accepted = alice.post("/v1/jobs", json=job(idempotency_key="k1")).json()
    job_id, rollout_id = accepted["job_id"], accepted["rollout_ids"][0]
    for method, path in (
        ("GET", f"/v1/jobs/{job_id}"),
        ("POST", f"/v1/jobs/{job_id}/cancel"),
        ("GET", f"/v1/jobs/{job_id}/results"),
        ("GET", f"/v1/rollouts/{rollout_id}"),
        ("POST", f"/v1/rollouts/{rollout_id}/reevaluate"),
    ):
        rejected(bob.request(method, path), 404, "not found")
    assert bob.get("/v1/jobs").json()["jobs"] == []
    assert alice.get(f"/v1/jobs/{job_id}").json()["status"] == "running"  # bob cancelled nothing
    mine = bob.post("/v1/jobs", json=job(idempotency_key="k1")).json()  # same key, own job
    assert mine["created"] is True and mine["job_id"] != job_id


def test_llm_servers_belong_to_their_owner(gateway):
    alice, bob = gateway["alice"], gateway["bob"]
    server = alice.post("/v1/llm-servers", json={"url": "http://10.9.0.1:8000"}).json()
    assert bob.get("/v1/llm-servers").json()["servers"] == []
    rejected(bob.put(f"/v1/llm-servers/{server['id']}", json={"weight_version": "x"}), 404, "not found")
    rejected(bob.delete(f"/v1/llm-servers/{server['id']}"), 404, "not found")
    assert bob.post("/v1/llm-servers", json={"url": "http://10.9.0.1:8000"}).status_code == 201
    assert bob.post("/clear_llm_server").json()["removed"] == 1
    assert [s["url"] for s in alice.get("/v1/llm-servers").json()["servers"]] == ["http://10.9.0.1:8000"]


def test_operator_routes_need_the_admin_role(gateway):
    rejected(gateway["alice"].post("/start"), 403, "operator route")
    rejected(gateway["alice"].post("/stop"), 403, "operator route")
    assert gateway["operator"].post("/start").status_code == 200
    assert gateway["operator"].post("/stop").status_code == 200
    # the operator registers any URL (its own pool); a tenant only allowlisted ones
    assert gateway["operator"].post("/v1/llm-servers", json={"url": "http://127.0.0.1:9"}).status_code == 201


def test_database_tokens_from_the_admin_cli(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "RAAS_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    cli = [sys.executable, "-m", "app.ops.cli"]
    from migrations.runner import upgrade

    settings = Settings(home=tmp_path, handler_modules="tests.pipeline_handlers")
    upgrade(settings.db_url)
    add = subprocess.run(
        [*cli, "token", "add", "carol", "--label", "ci"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    token = add.stdout.strip()
    server, client = serve(settings)
    try:
        assert client.get("/v1/jobs").status_code == 401  # a token exists: auth is on
        carol = {"Authorization": f"Bearer {token}"}
        assert client.get("/v1/policy", headers=carol).json()["owner"] == "carol"
        listing = subprocess.run(
            [*cli, "token", "list"], env=env, capture_output=True, text=True, timeout=60, check=True
        ).stdout
        assert "carol" in listing and token not in listing
        subprocess.run([*cli, "token", "rm", token], env=env, check=True, timeout=60, capture_output=True)
        assert client.get("/v1/jobs", headers=carol).status_code == 200  # no tokens left
        assert client.get("/v1/policy", headers=carol).json()["owner"] == "default"
    finally:
        server.shutdown()


def test_a_token_that_starts_with_a_dash_is_removed_by_the_cli(tmp_path):
    """1 in 64 bare `token_urlsafe` values start with `-`: new tokens never do, old ones still go."""
    from app.auth import new_token, token_digest
    from core.db import session_scope
    from core.models import ApiToken
    from migrations.runner import upgrade

    assert not any(new_token().startswith("-") for _ in range(2000))
    settings = Settings(home=tmp_path)
    upgrade(settings.db_url)
    legacy = "-gp1ueJuer3fYh-O4UhdTVJTm_aJqJwHvb4BjImF4Mk"  # the one that failed CI
    with session_scope(settings.db_url) as s:
        s.add(ApiToken(id=token_digest(legacy), owner="carol", admin=False, label=None))
    env = {"PATH": "/usr/bin:/bin", "RAAS_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "app.ops.cli", "token", "rm", legacy],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip() == "removed", done.stderr
    with session_scope(settings.db_url) as s:
        assert s.get(ApiToken, token_digest(legacy)) is None


def test_no_token_service_refuses_a_public_address(tmp_path):
    from core.settings import embedded_redis_socket

    env = {"PATH": "/usr/bin:/bin", "RAAS_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    from migrations.runner import upgrade

    upgrade(Settings(home=tmp_path).db_url)
    run = subprocess.run(
        [sys.executable, "-m", "app.ops.cli", "gateway", "--host", "0.0.0.0", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0 and "refusing to listen on 0.0.0.0 without API tokens" in run.stderr
    run = subprocess.run(
        [sys.executable, "-m", "app.ops.cli", "flower", "--address", "0.0.0.0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0 and "--basic-auth" in run.stderr
    from tasks.broker.embedded_redis import answers

    assert not answers(embedded_redis_socket(tmp_path))  # refused before starting a broker


def test_embedded_default_without_tokens_is_one_local_admin(tmp_path):
    server, client = serve(Settings(home=tmp_path, handler_modules="tests.pipeline_handlers"))
    try:
        assert client.get("/v1/policy").json() | {"sandbox": 0, "llm": 0} == {
            "owner": "default",
            "admin": True,
            "sandbox": 0,
            "llm": 0,
        }
        assert client.post("/v1/jobs", json=job()).status_code == 202
    finally:
        server.shutdown()


def test_documented_policy_file_loads(tmp_path, monkeypatch):
    """The TOML example of docs/policy-and-tenants.md is a valid policy file (RAAS_POLICY_FILE)."""
    import re

    toml = re.search(r"```toml\n(.*?)```", (REPO / "docs" / "policy-and-tenants.md").read_text(), re.S).group(1)
    (tmp_path / "policy.toml").write_text(toml)
    monkeypatch.setenv("RAAS_POLICY_FILE", str(tmp_path / "policy.toml"))
    policy = Settings(home=tmp_path).policy
    assert policy.sandbox.python_envs == ["math", "pytest"] and policy.sandbox.network is False
    assert policy.llm.credentials["openai"].env == "OPENAI_API_KEY"
    with pytest.raises(ValidationError, match="LD_"):
        Settings(home=tmp_path, policy_file=None, policy={"sandbox": {"env": ["LD_*"]}})


def test_credential_goes_only_where_the_operator_said(monkeypatch):
    """A registered credential is read from the operator's variable and sent as the bearer
    token to its allowed URL (real HTTP); a job cannot name the variable itself."""
    from agents.llm import LLMSession
    from core.policy import LLMPolicy

    seen = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            seen.append(self.headers.get("Authorization"))
            self.send_response(503)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.setenv("OPERATOR_SECRET", "s3cret-value")
    policy = LLMPolicy(credentials={"vendor": {"env": "OPERATOR_SECRET", "urls": [url]}})
    spec = {"servers": [{"url": url, "model": "m", "credential": "vendor"}], "tokenizer": SMOLLM2}
    try:
        with LLMSession.open(spec, {"max_tokens": 4}, "r-cred", policy=policy) as s:
            s.start([{"role": "user", "content": "hi"}])
            with pytest.raises(Exception):  # noqa: B017 - what matters is the header the server saw
                s.generate(__import__("time").monotonic() + 3)
        assert seen and set(seen) == {"Bearer s3cret-value"}
    finally:
        server.shutdown()
