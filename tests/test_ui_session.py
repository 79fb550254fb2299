"""Issue 22.8: the dashboard session, attacked through the real gateway over real HTTP.

Each attack (login CSRF through `?token=`, the token read back from the cookie, a form POST
without its token, a cross-site POST) is refused while the honest path in the same run works.
"""

from __future__ import annotations

import base64
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from sqlalchemy import func, select

from core.db import session_scope
from core.models import UISession
from tests.test_api import serve
from tests.test_trust import ALICE, BOB, job, tenant_settings


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    settings = tenant_settings(tmp_path_factory.mktemp("ui-session"))
    server, _ = serve(settings)
    base = f"http://127.0.0.1:{server.server_port}"
    api = httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {ALICE}"})
    alice_job = api.post("/v1/jobs", json=job()).json()["job_id"]
    bob_job = httpx.post(f"{base}/v1/jobs", json=job(), timeout=30, headers={"Authorization": f"Bearer {BOB}"}).json()[
        "job_id"
    ]
    yield {"base": base, "api": api, "settings": settings, "alice_job": alice_job, "bob_job": bob_job}
    api.close()
    server.shutdown()


@contextmanager
def logged_in(base: str, token: str = ALICE) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base, timeout=30) as browser:
        resp = browser.post("/ui/login", data={"token": token, "next": "/ui/"})
        assert resp.status_code == 303, resp.text
        yield browser


def cookie_payload(value: str) -> bytes:
    """What Flask's signed cookie carries (base64 of JSON, zlib'd when it starts with '.')."""
    compressed = value.startswith(".")
    data = value.lstrip(".").split(".")[0]
    raw = base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))
    return zlib.decompress(raw) if compressed else raw


def sessions_stored(ui) -> int:
    with session_scope(ui["settings"].db_url) as s:
        return s.scalar(select(func.count()).select_from(UISession))


def test_the_cookie_holds_a_session_id_never_the_token(ui):
    before = sessions_stored(ui)
    with logged_in(ui["base"]) as browser:
        cookie = browser.cookies.get("raas_ui")
        assert cookie and ALICE.encode() not in cookie_payload(cookie)
        assert ALICE not in cookie
        assert browser.get("/ui/").status_code == 200
        assert browser.get("/v1/jobs").status_code == 401  # the cookie never reaches /v1
    assert sessions_stored(ui) == before + 1


def test_cookie_flags_samesite_lax_httponly_and_path(ui):
    resp = httpx.post(f"{ui['base']}/ui/login", data={"token": ALICE}, timeout=30)
    header = resp.headers["set-cookie"]
    assert "SameSite=Lax" in header and "HttpOnly" in header and "Path=/ui" in header
    assert "Secure" not in header  # plain HTTP here; over HTTPS see the next test


def test_cookie_is_secure_over_https(tmp_path):
    from app import create_app
    from migrations.runner import upgrade

    settings = tenant_settings(tmp_path)
    upgrade(settings.db_url)
    client = create_app(settings).test_client()  # the WSGI app with an https request
    resp = client.post("/ui/login", data={"token": ALICE}, base_url="https://raas.example")
    assert resp.status_code == 303 and "Secure" in resp.headers["Set-Cookie"]


def test_a_token_link_never_replaces_a_session_login_csrf(ui):
    with logged_in(ui["base"]) as browser:
        resp = browser.get(f"/ui/?token={BOB}", follow_redirects=True)
        assert resp.status_code == 200 and ui["alice_job"] in resp.text
        assert ui["bob_job"] not in resp.text  # still alice: bob's link changed nothing
    with httpx.Client(base_url=ui["base"], timeout=30) as fresh:
        resp = fresh.get(f"/ui/?token={ALICE}")
        assert resp.status_code == 200 and 'id="login-confirm"' in resp.text
        assert "raas_ui" not in fresh.cookies  # no session until the user submits the form
        assert fresh.get("/ui/").status_code == 401
        assert fresh.get("/ui/?token=wrong-token-xx").status_code == 401


def test_a_form_post_without_its_token_is_refused(ui):
    job_id = ui["api"].post("/v1/jobs", json=job()).json()["job_id"]
    with logged_in(ui["base"]) as browser:
        for data in ({}, {"csrf": ""}, {"csrf": "forged-value"}):
            resp = browser.post(f"/ui/jobs/{job_id}/cancel", data=data)
            assert resp.status_code == 400, (data, resp.status_code)
        assert ui["api"].get(f"/v1/jobs/{job_id}").json()["status"] == "running"
        page = browser.get(f"/ui/jobs/{job_id}").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
        resp = browser.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": csrf})
        assert resp.status_code == 303  # the honest form
    assert ui["api"].get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Referer": "http://evil.example/page"},
        {"Origin": "null"},
    ],
)
def test_cross_site_posts_are_refused(ui, headers):
    job_id = ui["alice_job"]
    resp = httpx.post(f"{ui['base']}/ui/login", data={"token": BOB}, headers=headers, timeout=30)
    assert resp.status_code == 403 and "raas_ui" not in resp.cookies
    with logged_in(ui["base"]) as browser:
        page = browser.get(f"/ui/jobs/{job_id}").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
        resp = browser.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": csrf}, headers=headers)
        assert resp.status_code == 403
        assert browser.post("/ui/logout", headers=headers).status_code == 403
        assert browser.get("/ui/").status_code == 200  # still logged in
        same = {"Origin": ui["base"], "Sec-Fetch-Site": "same-origin"}
        assert browser.post("/ui/logout", headers=same).status_code == 303
    assert ui["api"].get(f"/v1/jobs/{job_id}").json()["status"] == "running"


def test_logout_ends_the_session_on_the_server(ui):
    with logged_in(ui["base"]) as browser:
        stolen = browser.cookies.get("raas_ui")
        assert browser.post("/ui/logout").status_code == 303
    with httpx.Client(base_url=ui["base"], timeout=30, cookies={"raas_ui": stolen}) as replay:
        assert replay.get("/ui/").status_code == 401  # the copied cookie is dead
