"""The /ui blueprint's credentials: login form, server-side sessions, CSRF, same-origin POSTs.

The API's auth hook stays the only judge of a token. A browser logs in by POSTing its token
(same-origin only) to /ui/login; the hook accepts it, and a server-side session
(`app.ui.sessions`) is created whose random id is all the cookie holds. For /ui paths without
an Authorization header, `_bridge_credentials` (installed ahead of every other before-request
function) hands the hook the session's principal, or the login form's token. A `?token=` link
never logs in by itself (that was a login CSRF: `/ui/?token=<other>` silently replaced a
session): without a session it shows the login form filled in, to be submitted; with one it is
dropped. API paths never read the cookie, so a browser session cannot call /v1 routes.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import urlencode, urlsplit

from flask import Blueprint, Flask, abort, g, redirect, render_template, request
from flask import session
from flask.sessions import SecureCookieSessionInterface

from app.auth import UI_PRINCIPAL, auth_enabled
from app.context import SETTINGS_KEY, gateway_settings
from app.ui import sessions
from core.errors import NotFound, Unauthorized

bp = Blueprint(
    "ui", __name__, url_prefix="/ui", template_folder="templates", static_folder="static", static_url_path="/static"
)
SESSION_ID = "raas_sid"


def session_secret(settings) -> bytes:  # untyped: Settings
    """The cookie-signing key: configured, else derived from the settings' API tokens (the
    same on every gateway of a deployment), else random per process (tokens only in the
    database: set RAAS_UI_SECRET_KEY when several gateway processes serve one address)."""
    if settings.ui_secret_key:
        return settings.ui_secret_key.encode()
    material = "\n".join([settings.api_token or "", *sorted(settings.api_tokens)])
    if material.strip():
        return hmac.new(material.encode(), b"raas-ui-session", hashlib.sha256).digest()
    return secrets.token_bytes(32)


class _CookieInterface(SecureCookieSessionInterface):
    """Flask's signed cookie holding only the session id: `Secure` when served over HTTPS."""

    def get_cookie_secure(self, app: Flask) -> bool:
        return bool(app.config.get("SESSION_COOKIE_SECURE")) or request.is_secure


@bp.record_once
def _install(state) -> None:  # untyped: BlueprintSetupState
    app: Flask = state.app
    if not app.secret_key:
        app.secret_key = session_secret(app.config[SETTINGS_KEY])
    app.config["SESSION_COOKIE_HTTPONLY"] = True
    app.config["SESSION_COOKIE_SAMESITE"] = "Lax"  # Flask defines the key as None: set it
    app.config["SESSION_COOKIE_NAME"] = "raas_ui"
    app.config["SESSION_COOKIE_PATH"] = "/ui"
    app.session_interface = _CookieInterface()
    # First of all before-request functions: the auth hook must see the bridged credentials.
    app.before_request_funcs.setdefault(None, []).insert(0, _bridge_credentials)


def same_origin() -> bool:
    """False for a browser request sent from another site (Sec-Fetch-Site, else Origin or
    Referer); True when none is sent (not a browser form: nothing cross-site to forge)."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        return site in ("same-origin", "none")
    source = request.headers.get("Origin") or request.headers.get("Referer")
    if source is None:
        return True
    parts = urlsplit(source)
    return f"{parts.scheme}://{parts.netloc}" == request.host_url.rstrip("/")


def _bridge_credentials() -> None:
    """Hand a /ui request's credentials (session, login form, `?token=` link) to the hook."""
    if not request.path.startswith("/ui") or request.environ.get("HTTP_AUTHORIZATION"):
        return
    if request.method == "POST" and not same_origin():
        abort(403, "cross-site form posts to the dashboard are refused")
    if request.path == "/ui/login" and request.method == "POST":
        token = request.form.get("token")
        if token:
            request.environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
            g.ui_login_token = token
        return
    session_id = session.get(SESSION_ID)
    if session_id:
        live = sessions.lookup(gateway_settings(), session_id)
        if live is not None:
            request.environ[UI_PRINCIPAL] = live.principal
            g.ui_session, g.ui_cookie_auth = live, True
            return
        session.pop(SESSION_ID)
    token = request.args.get("token") if request.method == "GET" else None
    if token:
        request.environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
        g.ui_token_link = token


@bp.before_request
def _token_link():
    """A `?token=` link (after the hook accepted it) shows the login form filled in, to be
    submitted by the user; with a live session it is only dropped from the URL."""
    if request.method != "GET" or "token" not in request.args:
        return None
    args = {k: v for k, v in request.args.items() if k != "token"}
    here = request.path + ("?" + urlencode(args) if args else "")
    if g.get("ui_token_link"):
        return render_template("ui/login.html", next=safe_next(here), wrong=False, token=g.ui_token_link, confirm=True)
    return redirect(here)


def csrf_token() -> str:
    """The session's form token, for every form that POSTs ("" without a session: a bearer
    header or a service without tokens, where the cookie is not what authenticates)."""
    live = g.get("ui_session")
    return live.csrf if live is not None else ""


def check_csrf() -> None:
    """A POST authenticated by the session cookie must carry the session's form token; a
    missing or empty one is always refused."""
    if not g.get("ui_cookie_auth"):
        return  # a bearer header or no auth at all: a cross-site form cannot forge either
    given = request.form.get("csrf") or ""
    if not given or not hmac.compare_digest(given.encode(), g.ui_session.csrf.encode()):
        abort(400, "missing or stale form token; reload the page")


@bp.app_context_processor
def _template_globals() -> dict:
    return {"csrf_token": csrf_token}


def safe_next(value: str | None) -> str:
    """Only local /ui paths are followed after login (no open redirect)."""
    if value and value.startswith("/ui") and "//" not in value and "\\" not in value:
        return value
    return "/ui/"


@bp.get("/login")
def login_form():
    """Already authenticated (or no auth configured): go on."""
    return redirect(safe_next(request.args.get("next")))


@bp.post("/login")
def login():
    """The hook accepted the posted token: start a server-side session (a new id, replacing
    this browser's old one); the cookie gets the id only."""
    token = g.get("ui_login_token")
    settings = gateway_settings()
    if token and auth_enabled(settings):
        old = session.get(SESSION_ID)
        if old:
            sessions.end(settings, old)
        session.clear()
        session[SESSION_ID] = sessions.create(settings, token)[0]
    return redirect(safe_next(request.form.get("next")), code=303)


@bp.post("/logout")
def logout():
    """End the session (same-origin POSTs only, like every dashboard POST)."""
    session_id = session.get(SESSION_ID)
    if session_id:
        sessions.end(gateway_settings(), session_id)
    session.clear()
    return redirect("/ui/login", code=303)


@bp.errorhandler(Unauthorized)
def _unauthorized(exc: Unauthorized):
    """Browser navigation without (valid) credentials: the login form, status 401."""
    if request.path.endswith(".json") or request.accept_mimetypes.best == "application/json":
        return exc.to_dict(), 401
    wrong = bool(request.environ.get("HTTP_AUTHORIZATION"))
    args = {k: v for k, v in request.args.items() if k != "token"}
    here = request.path + ("?" + urlencode(args) if args else "")
    nxt = request.form.get("next") if request.method == "POST" else here
    return render_template("ui/login.html", next=safe_next(nxt), wrong=wrong), 401


@bp.errorhandler(NotFound)
def _not_found(exc: NotFound):
    """Unknown id or another tenant's: the same 404 either way."""
    if request.path.endswith(".json"):
        return exc.to_dict(), 404
    return render_template("ui/error.html", title="Not found", message=exc.message), 404
