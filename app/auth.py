"""Who is calling: bearer tokens mapped to owners (tenants), and the admin role.

Tokens come from settings (`api_token` = the operator, `api_tokens` = tenants) and from the
`api_tokens` table (`raas token add`), where only their SHA-256 is kept. With no token anywhere
the service has one local owner with the admin role; the CLI refuses to bind such a gateway to
a non-loopback address unless told `--insecure`. A request names its token with the `Bearer`
scheme only; settings tokens are compared in constant time, table tokens are looked up by hash.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flask import g, request
from sqlalchemy import select

from app.context import gateway_settings
from core.settings import Settings
from core.db import session_scope
from core.errors import Forbidden, Unauthorized
from core.models import ApiToken
from core.policy import DEFAULT_OWNER as LOCAL_OWNER

OPEN_PATHS = {"/healthz", "/readyz", "/metrics", "/openapi.json"}
UI_PRINCIPAL = "raas.ui_principal"  # WSGI environ key: set only by the /ui session bridge


@dataclass(frozen=True)
class Principal:
    """The caller: the owner its rows belong to, and whether it may use operator routes."""

    owner: str
    admin: bool


def token_digest(token: str) -> str:
    """The stored form of a token."""
    return hashlib.sha256(token.encode()).hexdigest()


TOKEN_PREFIX = "raas_"


def new_token() -> str:
    """A fresh random token: `raas_` and 43 URL-safe characters.

    The prefix keeps the first character off `-` (1 in 64 bare `token_urlsafe` values start
    with it, and a command line then reads the token as an option) and lets secret scanners
    recognise a leaked one.
    """
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def database_has_tokens(db_url: str) -> bool:
    """True when `raas token add` stored at least one token."""
    with session_scope(db_url) as s:
        return s.scalar(select(ApiToken.id).limit(1)) is not None


def auth_enabled(settings: Settings) -> bool:
    """True when any token is configured (settings or database)."""
    return settings.auth_configured or database_has_tokens(settings.db_url)


def bearer_token() -> str | None:
    """The token of `Authorization: Bearer <token>`; another scheme or shape is a 401."""
    header = request.headers.get("Authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("the Authorization header must be `Bearer <token>`")
    return token.strip()


def resolve(settings: Settings, token: str) -> Principal | None:
    """The principal a token speaks for, or None."""
    given = token.encode()
    found: Principal | None = None
    if settings.api_token is not None and hmac.compare_digest(given, settings.api_token.encode()):
        found = Principal(LOCAL_OWNER, admin=True)
    for secret, grant in settings.api_tokens.items():  # every one compared: constant time
        if hmac.compare_digest(given, secret.encode()):
            found = Principal(grant.owner, grant.admin)
    if found is not None:
        return found
    with session_scope(settings.db_url) as s:
        row = s.get(ApiToken, token_digest(token))
        return Principal(row.owner, row.admin) if row is not None else None


def resolve_digest(settings: Settings, digest: str) -> Principal | None:
    """The principal of the token whose SHA-256 is `digest` (a dashboard session), or None."""
    found: Principal | None = None
    if settings.api_token is not None and hmac.compare_digest(digest, token_digest(settings.api_token)):
        found = Principal(LOCAL_OWNER, admin=True)
    for secret, grant in settings.api_tokens.items():
        if hmac.compare_digest(digest, token_digest(secret)):
            found = Principal(grant.owner, grant.admin)
    if found is not None:
        return found
    with session_scope(settings.db_url) as s:
        row = s.get(ApiToken, digest)
        return Principal(row.owner, row.admin) if row is not None else None


def authenticate() -> None:
    """before_request: set `g.owner` / `g.admin` or answer 401."""
    settings: Settings = gateway_settings()
    g.owner, g.admin = LOCAL_OWNER, False
    if request.path in OPEN_PATHS:
        return
    ui_principal = request.environ.get(UI_PRINCIPAL)  # a /ui session (app.ui.auth)
    if ui_principal is not None:
        g.owner, g.admin = ui_principal.owner, ui_principal.admin
        return
    if not auth_enabled(settings):
        g.admin = True  # no tokens anywhere: the single local owner is the operator
        return
    token = bearer_token()
    if token is None:
        raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
    principal = resolve(settings, token)
    if principal is None:
        raise Unauthorized("unknown bearer token")
    g.owner, g.admin = principal.owner, principal.admin


def require_admin(view: Callable) -> Callable:
    """Operator routes: a tenant token gets 403."""

    @functools.wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not g.get("admin"):
            raise Forbidden(f"{request.path} is an operator route; this token is not an admin")
        return view(*args, **kwargs)

    return wrapper


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and `localhost`."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(settings: Settings, host: str, insecure: bool) -> None:
    """Refuse to serve a non-loopback address without tokens, unless told `--insecure`."""
    if is_loopback(host) or insecure or auth_enabled(settings):
        return
    from core.errors import ConfigError

    raise ConfigError(
        f"refusing to listen on {host} without API tokens: set RAAS_API_TOKEN / "
        "RAAS_API_TOKENS or `raas token add`, bind 127.0.0.1, or pass --insecure"
    )
