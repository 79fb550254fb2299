"""Issue 22 items 5 and 7: a hostile tenant's URLs and server answers, through the real gateway.

`Upstream` is a plain HTTP server standing in for an inference server's GET /v1/models (a fake
of that one route: no model runs); it records every request it gets, so a test shows that a
refused URL was never called. Each attack sits next to an honest control in the same run.
"""

from __future__ import annotations

import http.server
import json
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.llm.conftest import SMOLLM2
from tests.test_api import serve
from tests.test_trust import ALICE, OPERATOR, rejected, tenant_settings


class Upstream:
    """A recording HTTP server: /v1/models reports `root`; `redirect` answers 307 there."""

    def __init__(self, root: str | None = None, redirect: str | None = None) -> None:
        self.seen: list[str] = []
        self.root, self.redirect = root, redirect
        upstream = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                upstream.seen.append(f"GET {self.path}")
                if upstream.redirect:
                    self.send_response(307)
                    self.send_header("Location", upstream.redirect + self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = json.dumps({"data": [{"id": "m", "root": upstream.root}]}).encode()
                self.send_response(200 if self.path == "/v1/models" else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                upstream.seen.append(f"POST {self.path}")
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstreams():
    made: list[Upstream] = []

    def make(**kw) -> Upstream:
        made.append(Upstream(**kw))
        return made[-1]

    yield make
    for u in made:
        u.close()


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    root = tmp_path_factory.mktemp("roots") / "tokenizers"
    shutil.copytree(SMOLLM2, root / "smollm2")
    return root


def gateway_for(tmp_path, rules, roots):
    settings = tenant_settings(tmp_path, llm={"server_urls": rules, "tokenizer_roots": [str(roots)]})
    server, _ = serve(settings)
    url = f"http://127.0.0.1:{server.server_port}"
    clients = {
        name: httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {token}"})
        for name, token in (("alice", ALICE), ("operator", OPERATOR))
    }
    return server, clients


def llm_job(servers):
    return {
        "agent": "test-needs-llm",
        "instances": [{"instance_id": "a"}],
        "n_samples": 1,
        "llm": {"servers": [{"url": u} for u in servers]},
    }


# -- 22.5: the allowlist matches scheme, host, port and path separately ---------------------


def test_another_port_of_an_allowed_host_is_refused_and_never_called(tmp_path, upstreams, roots):
    allowed = upstreams(root=str(roots / "smollm2"))
    victim = upstreams(root=str(roots / "smollm2"))  # e.g. Redis or an admin panel
    server, c = gateway_for(tmp_path, [f"http://[127.0.0.0/16]:{allowed.port}"], roots)
    try:
        attack = f"http://127.0.0.1:{victim.port}/x:{allowed.port}"  # accepted by the old glob
        rejected(
            c["alice"].post("/v1/jobs", json=llm_job([attack])), 400, "llm.servers[0].url", "policy.llm.server_urls"
        )
        rejected(c["alice"].post("/v1/llm-servers", json={"url": attack}), 400, "url")
        resp = c["alice"].post("/add_llm_server", json={"address": attack[len("http://") :]})
        assert resp.status_code == 400 and "policy.llm.server_urls" in resp.json()["detail"]
        for name in (
            f"http://127.0.0.evil.invalid:{allowed.port}",  # "any name beginning"
            f"https://127.0.0.1:{allowed.port}",
        ):  # another scheme
            rejected(c["alice"].post("/v1/jobs", json=llm_job([name])), 400, "policy.llm.server_urls")
        assert victim.seen == []  # the gateway never called the other port
        # honest control, same run: the allowed URL is accepted and was asked for its model
        ok = c["alice"].post("/v1/jobs", json=llm_job([allowed.url]))
        assert ok.status_code == 202, ok.text
        assert c["alice"].post("/v1/llm-servers", json={"url": allowed.url}).status_code == 201
        assert "GET /v1/models" in allowed.seen
        assert c["operator"].post("/v1/llm-servers", json={"url": attack}).status_code == 201
    finally:
        server.shutdown()


def test_path_prefix_and_port_range_rules(tmp_path, upstreams, roots):
    up = upstreams(root=str(roots / "smollm2"))
    rules = [f"http://127.0.0.1:{up.port - 1}-{up.port + 1}/v2"]
    server, c = gateway_for(tmp_path, rules, roots)
    try:
        for url in (f"{up.url}/v20", up.url, f"http://127.0.0.1:{up.port + 2}/v2"):
            rejected(c["alice"].post("/v1/llm-servers", json={"url": url}), 400, "policy.llm.server_urls")
        assert c["alice"].post("/v1/llm-servers", json={"url": f"{up.url}/v2/x"}).status_code == 201
    finally:
        server.shutdown()


DOT_PATHS = [
    "/v2/../admin",
    "/v2/./x",
    "/v2/%2e%2e/admin",
    "/v2/%2E%2e/admin",
    "/v2/..%2fadmin",
    "/v2/x%2Fy",
    "/v2/%5c..%5cadmin",
    "/v2/%2e",
]


def test_dot_segments_and_encoded_separators_are_refused_at_submission_and_connection(tmp_path, upstreams, roots):
    """Review 1 item 8: a path-prefix rule matches text; `..` is resolved by httpx and `%2e`
    by many servers, so either could step out of the allowed prefix. Both are refused when
    submitted (a 400 naming the field) and at the connection guard (nothing is sent)."""
    from agents.llm.backends.guard import UrlRefused, check_request
    from core.urls import parse_rule, url_refusal

    up = upstreams(root=str(roots / "smollm2"))
    rules = [f"http://127.0.0.1:{up.port}/v2"]
    for path in DOT_PATHS:
        assert url_refusal(f"{up.url}{path}", [parse_rule(rules[0])]) is not None, path
        if path == "/v2/./x":
            continue  # httpx resolves it to /v2/x before the guard sees it: inside the prefix
        with pytest.raises(UrlRefused):
            check_request([parse_rule(rules[0])], httpx.URL(f"{up.url}{path}/v1/models"))
    check_request([parse_rule(rules[0])], httpx.URL(f"{up.url}/v2/x/v1/models"))  # control
    server, c = gateway_for(tmp_path, rules, roots)
    try:
        for path in DOT_PATHS:
            rejected(c["alice"].post("/v1/llm-servers", json={"url": f"{up.url}{path}"}), 400, "url")
            rejected(c["alice"].post("/v1/jobs", json=llm_job([f"{up.url}{path}"])), 400, "llm.servers.0.url")
        assert up.seen == []
        assert c["alice"].post("/v1/llm-servers", json={"url": f"{up.url}/v2/x"}).status_code == 201  # control
    finally:
        server.shutdown()


def test_old_glob_setting_stops_start_up_naming_the_new_format(tmp_path):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as err:
        tenant_settings(tmp_path, llm={"server_urls": ["http://127.0.*:8000"]})
    text = str(err.value)
    assert "policy.llm.server_urls" in text and "glob over the whole URL" in text
    assert "http://[127.0.0.0/16]:8000" in text  # the translation to write instead


def test_redirects_are_never_followed(tmp_path, upstreams, roots):
    target = upstreams(root=str(roots / "smollm2"))
    bouncer = upstreams(redirect=target.url)
    server, c = gateway_for(tmp_path, [f"http://127.0.0.1:{bouncer.port}", f"http://127.0.0.1:{target.port}"], roots)
    try:
        rejected(c["alice"].post("/v1/jobs", json=llm_job([bouncer.url])), 400, "llm.tokenizer")
        assert bouncer.seen == ["GET /v1/models"] and target.seen == []
    finally:
        server.shutdown()


def test_a_name_is_checked_against_ranges_at_connection_time(upstreams):
    """`localhost` resolves to 127.0.0.1: under a rule for 10.9.0.0/16 the connection is
    refused when it is made (whatever the name resolved to earlier); under 127.0.0.0/8 it goes."""
    from agents.llm.backends.guard import url_guard
    from agents.llm.backends.http_client import make_client
    from core.urls import parse_rule

    up = upstreams(root="x")
    url = f"http://localhost:{up.port}/v1/models"
    with make_client() as client:
        with url_guard([parse_rule(f"http://[10.9.0.0/16]:{up.port}")]):
            with pytest.raises(httpx.ConnectError, match="resolves to no address"):
                client.get(url)
        with url_guard([parse_rule(f"http://[10.9.0.0/16]:{up.port + 1}")]):
            with pytest.raises(httpx.ConnectError, match="not allowed"):
                client.get(url)  # refused before any lookup: no rule for that port
        assert up.seen == []
        with url_guard([parse_rule(f"http://[127.0.0.0/8]:{up.port}")]):
            assert client.get(url).status_code == 200
        assert up.seen == ["GET /v1/models"]


def test_a_workers_session_calls_only_allowed_urls(upstreams):
    """The RUN stage's session of a tenant job (url_rules set) never calls a server outside
    the rules, whatever the stored spec says; the operator's (no rules) does."""
    from agents.llm import LLMSession
    from core.urls import parse_rule

    up = upstreams(root="x")
    spec = {"servers": [{"url": up.url, "model": "m"}], "tokenizer": SMOLLM2}
    rules = [parse_rule(f"http://[10.9.0.0/16]:{up.port}")]
    with LLMSession.open(spec, {"max_tokens": 4}, "r-guard", url_rules=rules) as s:
        s.start([{"role": "user", "content": "hi"}])
        with pytest.raises(Exception):  # noqa: B017 - what matters is that nothing reached the server
            s.generate(time.monotonic() + 3)
    assert up.seen == []
    control = upstreams(root="x")  # (the refused URL is now marked down in this process)
    spec["servers"] = [{"url": control.url, "model": "m"}]
    with LLMSession.open(spec, {"max_tokens": 4}, "r-open") as s:
        s.start([{"role": "user", "content": "hi"}])
        with pytest.raises(Exception):  # noqa: B017 - what matters is that the request went out
            s.generate(time.monotonic() + 3)  # the stand-in answers 503
    assert any(line.startswith("POST ") for line in control.seen)


def test_probe_holds_a_tenants_stored_urls_to_todays_rules(tmp_path, upstreams, roots):
    """Review 1 item 2: `?probe=1` calls each stored URL from executor threads; each thread
    enters the guard itself. A tenant row the rules no longer allow (rules tightened, or a name
    re-pointed since registration) is never called and reflects nothing; an operator's is."""
    from core.db import session_scope
    from core.models import LLMServer

    secret = upstreams(root="/srv/internal-secret")
    control = upstreams(root=str(roots / "smollm2"))
    rules = ["http://[10.9.0.0/16]:*"]
    server, c = gateway_for(tmp_path, rules, roots)
    try:
        db_url = tenant_settings(tmp_path, llm={"server_urls": rules}).db_url
        with session_scope(db_url) as s:  # stored when the rules still allowed it
            s.add(LLMServer(owner="alice", url=secret.url, model="m"))
        assert c["operator"].post("/v1/llm-servers", json={"url": control.url}).status_code == 201
        control.seen.clear()
        resp = c["alice"].get("/v1/llm-servers", params={"probe": "1"})
        assert resp.status_code == 200, resp.text
        (view,) = resp.json()["servers"]
        assert view["reachable"] is False and view["served_models"] is None
        assert "not allowed" in view["probe_error"] and "internal-secret" not in resp.text
        assert secret.seen == []  # nothing was sent
        # honest control, same run: the operator's server is probed (no rules for an admin)
        (own,) = c["operator"].get("/v1/llm-servers", params={"probe": "1"}).json()["servers"]
        assert own["reachable"] is True and control.seen == ["GET /v1/models"]
    finally:
        server.shutdown()


# -- 22.7: the tokenizer roots hold for what a tenant's own server reports -------------------


def test_server_reported_tokenizer_outside_the_roots_no_oracle(tmp_path, upstreams, roots):
    inside = upstreams(root=str(roots / "smollm2"))
    outside = upstreams(root=SMOLLM2)  # exists, not under the roots
    missing = upstreams(root="/nonexistent/tokenizer")
    server, c = gateway_for(tmp_path, ["http://[127.0.0.0/8]:*"], roots)
    try:
        answers = set()
        for up in (outside, missing):
            body = rejected(
                c["alice"].post("/v1/jobs", json=llm_job([up.url])), 400, "llm.tokenizer", "tokenizer roots"
            )
            answers.add(body["message"])
        assert len(answers) == 1  # forbidden and missing answer the same
        assert c["alice"].post("/v1/jobs", json=llm_job([inside.url])).status_code == 202
        assert c["operator"].post("/v1/jobs", json=llm_job([outside.url])).status_code == 202
    finally:
        server.shutdown()


# -- 22.9: bad input is a 4xx naming the field, never a 500 ----------------------------------

ADDRESSES = [
    "http://not a url",
    "10.9.0.1:80\x00",
    "10.9.0.1:8\n000",
    "10.9.0.1:99999",
    "http://[zz]:80",
    "http://a_b!:80",
]


def test_prorl_add_llm_server_with_a_non_url_is_4xx_naming_address(tmp_path, roots):
    server, c = gateway_for(tmp_path, ["http://[10.9.0.0/16]:*"], roots)
    try:
        for address in ADDRESSES:
            resp = c["alice"].post("/add_llm_server", json={"address": address})
            assert resp.status_code in (400, 422), (address, resp.text)
            assert "address" in json.dumps(resp.json())
        ok = c["alice"].post("/add_llm_server", json={"address": "10.9.0.1:8000"})
        assert ok.status_code == 200 and ok.json()["added"] == "http://10.9.0.1:8000"
        assert len(c["alice"].get("/v1/llm-servers").json()["servers"]) == 1  # nothing else
    finally:
        server.shutdown()


def test_json_nested_200000_deep_is_400_and_the_service_stays_up(tmp_path, roots):
    server, c = gateway_for(tmp_path, [], roots)
    try:
        deep = b"[" * 200_000 + b"]" * 200_000
        for path in ("/v1/jobs", "/add_llm_server", "/v1/llm-servers"):
            resp = c["alice"].post(path, content=deep, headers={"Content-Type": "application/json"})
            assert resp.status_code == 400, (path, resp.status_code, resp.text[:200])
            assert "nested deeper than" in resp.text
        shallow_but_deep = {"agent": "test-trivial", "instances": [{"instance_id": "a", "data": {}}]}
        node = shallow_but_deep["instances"][0]["data"]
        for _ in range(100):
            node["x"] = {}
            node = node["x"]
        rejected(c["alice"].post("/v1/jobs", json=shallow_but_deep), 400, "nested deeper")
        ok = c["alice"].post("/v1/jobs", json={"agent": "test-trivial", "instances": [{"instance_id": "a"}]})
        assert ok.status_code == 202, ok.text
    finally:
        server.shutdown()


# -- 22.6: inline chat templates run with a budget -------------------------------------------

BOMBS = {
    "nested ranges (64 M iterations)": "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    "{% for a in range(400) %}{% for b in range(400) %}{% for c in range(400) %}{% endfor %}"
    "{% endfor %}{% endfor %}",
    "50 MB string": "{{ 'x' * 50000000 }}",
    "2 GB filter": "{{ 'x'|center(2000000000) }}",
    "power": "{{ 10 ** 10000000 }}",
    "syntax error": "{% for %}",
    "sandbox escape": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
}


def test_template_bombs_are_400_naming_the_field_and_the_gateway_stays_up(tmp_path, roots):
    server, c = gateway_for(tmp_path, [], roots)
    tokenizer = str(roots / "smollm2")
    try:
        for name, text in BOMBS.items():
            started = time.monotonic()
            body = {
                "agent": "test-needs-llm",
                "instances": [{"instance_id": "a"}],
                "llm": {"tokenizer": tokenizer, "chat_template_text": text},
            }
            rejected(c["alice"].post("/v1/jobs", json=body), 400, "llm.chat_template_text")
            assert time.monotonic() - started < 30, name  # bounded (the child's limits)
            assert c["alice"].get("/healthz").status_code == 200
        honest = (Path(SMOLLM2) / "chat_template.jinja").read_text()
        body = {
            "agent": "test-needs-llm",
            "instances": [{"instance_id": "a"}],
            "llm": {"tokenizer": tokenizer, "chat_template_text": honest},
        }
        ok = c["alice"].post("/v1/jobs", json=body)
        assert ok.status_code == 202, ok.text
    finally:
        server.shutdown()


CHAT = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
LATER = "{% if messages|length > 2 and messages[2].content == 'b' %}"  # never in the sample
ALLOCATION_BOMBS = {
    "center": LATER + "{{ ('x'|center(6000000000))|length }}{% endif %}" + CHAT,
    "doubling": LATER + "{% set ns = namespace(s='x') %}{% for i in range(27) %}"
    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}{% endif %}" + CHAT,
    "plus": LATER + "{% set ns = namespace(s='x') %}{% for i in range(27) %}"
    "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}{% endif %}" + CHAT,
    "method": LATER + "{{ 'x'.ljust(6000000000)|length }}{% endif %}" + CHAT,
    "percent": LATER + "{{ ('%6000000000s' % 'x')|length }}{% endif %}" + CHAT,
    "format": LATER + "{{ ('%6000000000s'|format('x'))|length }}{% endif %}" + CHAT,
    "replace": LATER + "{{ ('x' * 4000000)|replace('x', 'xxxxxxxxxx')|length }}{% endif %}" + CHAT,
    "join": LATER + "{{ (['x' * 4000000] * 100)|join|length }}{% endif %}" + CHAT,
    # many results, each under the per-result cap: the per-render total stops them
    "many": LATER + "{{ range(10000)|map('center', 4000000)|list|length }}{% endif %}" + CHAT,
    "list-repeat": LATER + "{{ (['x' * 4000000] * 10000)|string|length }}{% endif %}" + CHAT,
}


@pytest.mark.parametrize("name", list(ALLOCATION_BOMBS))
def test_strings_a_template_builds_are_capped_before_they_are_allocated(name):
    """Review 1 item 1: a template that behaves on the submission sample and, on a later chat
    rendered in a worker, asks for gigabytes (`center(6000000000)`) or doubles a string with
    `~` 27 times (134 M characters) is refused before the allocation, in milliseconds."""
    import resource

    from agents.llm.template_checker import check_untrusted_template
    from agents.llm.tokenizer import load_chat_tokenizer

    text = ALLOCATION_BOMBS[name]
    check_untrusted_template(SMOLLM2, text)  # the sample never reaches the branch
    tok = load_chat_tokenizer(SMOLLM2, text)
    chat = [{"role": "user", "content": "hi"}, {"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    with pytest.raises(Exception, match="over the cap") as err:
        tok.render(chat, add_generation_prompt=True)
    assert "MemoryError" not in type(err.value).__name__
    assert time.monotonic() - started < 2
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 100, grown_mb  # the doubling alone reached +183 MB before the cap
    # the control: the same template renders an ordinary chat
    assert tok.render(chat[:2]).startswith("<|im_start|>user\nhi<|im_end|>")


def test_capped_filters_and_operators_still_render_ordinary_templates():
    from agents.llm.tokenizer import load_chat_tokenizer

    text = (
        "{% set ns = namespace(s='') %}{% for m in messages %}"
        "{% set ns.s = ns.s ~ m['role'] ~ ':' + m['content'] %}{% endfor %}"
        "{{ ns.s }}|{{ 'ab'|center(6) }}|{{ ['a', 'b']|join(',') }}|{{ 'a-b'|replace('-', '+') }}"
        "|{{ '%s=%d'|format('n', 3) }}|{{ '%03d' % 7 }}|{{ 'x'.rjust(3, '.') }}"
        "|{{ '{}!'.format('hi') }}|{{ 'a\nb'|indent(2) }}|{{ '-'.join(['p', 'q']) }}"
        "|{{ [{'n': 'u'}, {'n': 'v'}]|join('/', attribute='n') }}"
    )
    tok = load_chat_tokenizer(SMOLLM2, text)
    out = tok.render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    assert out == "user:hiassistant:yo|  ab  |a,b|a+b|n=3|007|..x|hi!|a\n  b|p-q|u/v"


def test_a_render_past_its_deadline_stops_in_process(monkeypatch):
    """A template that is cheap on the submission sample and explodes on a longer chat (as a
    worker renders each turn): the in-process render stops at its deadline."""
    from agents.llm import template_budget
    from agents.llm.template_budget import TemplateOverBudget
    from agents.llm.tokenizer import load_chat_tokenizer

    monkeypatch.setattr(template_budget, "RENDER_SECONDS", 0.5)
    text = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if messages|length > 6 %}"
        "{% for a in range(10000) %}{% for b in range(10000) %}{% endfor %}{% endfor %}"
        "{% endif %}"
    )
    tok = load_chat_tokenizer(SMOLLM2, text)
    assert tok.render([{"role": "user", "content": "x"}] * 2) == "xx"  # the control
    started = time.monotonic()
    with pytest.raises(TemplateOverBudget, match="llm.chat_template_text"):
        tok.render([{"role": "user", "content": "x"}] * 8)
    assert time.monotonic() - started < 8  # 100 M iterations would take far longer
    assert tok.render([{"role": "user", "content": "y"}]) == "y"  # the lock was released
