"""The /ui blueprint's credentials: login form, `?token=`, signed session cookie, CSRF.

The API's auth hook stays the only judge of a token. For /ui paths without an Authorization
header, `_bridge_credentials` (installed ahead of every other before-request function) passes
the token from the login form, `?token=` or the session cookie to that hook as a bearer
header; the hook then sets `g.owner` as it does for API calls. API paths never read the cookie,
so a browser session cannot be used to call /v1 routes cross-site.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import urlencode

from flask import Blueprint, Flask, abort, g, redirect, render_template, request, session

from core.errors import NotFound, Unauthorized

bp = Blueprint("ui", __name__, url_prefix="/ui", template_folder="templates",
               static_folder="static", static_url_path="/static")
SESSION_TOKEN = "raas_token"
SESSION_CSRF = "raas_csrf"


def session_secret(settings) -> bytes:  # noqa: ANN001 - Settings
    """The cookie-signing key: configured, else derived from the settings' API tokens (the
    same on every gateway of a deployment), else random per process (tokens only in the
    database: set RAAS_UI_SECRET_KEY when several gateway processes serve one address)."""
    if settings.ui_secret_key:
        return settings.ui_secret_key.encode()
    material = "\n".join([settings.api_token or "", *sorted(settings.api_tokens)])
    if material.strip():
        return hmac.new(material.encode(), b"raas-ui-session", hashlib.sha256).digest()
    return secrets.token_bytes(32)


@bp.record_once
def _install(state) -> None:  # noqa: ANN001 - BlueprintSetupState
    app: Flask = state.app
    if not app.secret_key:
        app.secret_key = session_secret(app.config["RAAS"])
    app.config.setdefault("SESSION_COOKIE_HTTPONLY", True)
    app.config.setdefault("SESSION_COOKIE_SAMESITE", "Lax")
    app.config["SESSION_COOKIE_NAME"] = "raas_ui"
    # First of all before-request functions: the auth hook must see the bridged header.
    app.before_request_funcs.setdefault(None, []).insert(0, _bridge_credentials)


def _bridge_credentials() -> None:
    """Hand a /ui request's token (form, ?token=, cookie) to the auth hook as a bearer header."""
    if not request.path.startswith("/ui") or request.environ.get("HTTP_AUTHORIZATION"):
        return
    token = None
    if request.path == "/ui/login" and request.method == "POST":
        token = request.form.get("token")
    token = token or request.args.get("token") or session.get(SESSION_TOKEN)
    if token:
        request.environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
        g.ui_cookie_auth = token == session.get(SESSION_TOKEN)


@bp.before_request
def _remember_token():
    """After the hook accepted a `?token=`: keep it in the cookie and drop it from the URL."""
    token = request.args.get("token")
    if token and request.method == "GET":
        session[SESSION_TOKEN] = token
        args = {k: v for k, v in request.args.items() if k != "token"}
        return redirect(request.path + ("?" + urlencode(args) if args else ""))
    return None


def csrf_token() -> str:
    """The session's CSRF token (created on first use), for every form that POSTs."""
    if SESSION_CSRF not in session:
        session[SESSION_CSRF] = secrets.token_urlsafe(24)
    return session[SESSION_CSRF]


def check_csrf() -> None:
    """A POST authenticated by the cookie must carry the session's CSRF token."""
    if not g.get("ui_cookie_auth"):
        return  # a bearer header or no auth at all: a cross-site form cannot forge either
    given = request.form.get("csrf", "")
    if not hmac.compare_digest(given.encode(), session.get(SESSION_CSRF, "").encode()):
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
    """The hook accepted the posted token: keep it in the signed cookie."""
    token = request.form.get("token")
    if token:
        session[SESSION_TOKEN] = token
    return redirect(safe_next(request.form.get("next")), code=303)


@bp.post("/logout")
def logout():
    """Forget the token."""
    session.clear()
    return redirect("/ui/login", code=303)


@bp.errorhandler(Unauthorized)
def _unauthorized(exc: Unauthorized):
    """Browser navigation without (valid) credentials: the login form, status 401."""
    if request.path.endswith(".json") or request.accept_mimetypes.best == "application/json":
        return exc.to_dict(), 401
    wrong = bool(request.environ.get("HTTP_AUTHORIZATION"))
    if wrong and session.get(SESSION_TOKEN):
        session.pop(SESSION_TOKEN)
    nxt = request.form.get("next") if request.method == "POST" else request.full_path
    return render_template("ui/login.html", next=safe_next(nxt), wrong=wrong), 401


@bp.errorhandler(NotFound)
def _not_found(exc: NotFound):
    """Unknown id or another tenant's: the same 404 either way."""
    if request.path.endswith(".json"):
        return exc.to_dict(), 404
    return render_template("ui/error.html", title="Not found", message=exc.message), 404

