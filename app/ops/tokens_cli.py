"""`raas token add/list/rm`: the operator's table of tenant API tokens (stored as SHA-256)."""

from __future__ import annotations

import click
from sqlalchemy import delete, select

from core.settings import load_settings


@click.group("token")
def token_command() -> None:
    """Tenant API tokens kept in the database (each maps to an owner)."""


@token_command.command("add")
@click.argument("owner")
@click.option("--admin", is_flag=True, help="May use operator routes")
@click.option("--label", default=None, help="A note to recognise the token by")
def add(owner: str, admin: bool, label: str | None) -> None:
    """Create a token for OWNER and print it once (only its hash is kept)."""
    from app.auth import new_token, token_digest
    from core.settings import TokenGrant
    from core.db import session_scope
    from core.models import ApiToken

    TokenGrant(owner=owner, admin=admin)  # the same owner rules as settings tokens
    token = new_token()
    with session_scope(load_settings().db_url) as s:
        s.add(ApiToken(id=token_digest(token), owner=owner, admin=admin, label=label))
    click.echo(token)


@token_command.command("list")
def list_tokens() -> None:
    """Owner, role, label and the first 12 hex of each token's hash."""
    from core.db import session_scope
    from core.models import ApiToken

    with session_scope(load_settings().db_url) as s:
        rows = s.scalars(select(ApiToken).order_by(ApiToken.owner, ApiToken.created_at)).all()
        for row in rows:
            role = "admin" if row.admin else "tenant"
            click.echo(f"{row.id[:12]}  {row.owner}  {role}  {row.label or ''}  {row.created_at:%Y-%m-%d %H:%M}")


@token_command.command("rm", context_settings={"ignore_unknown_options": True})
@click.argument("token_or_hash_prefix")
def remove(token_or_hash_prefix: str) -> None:
    """Revoke a token, given itself or a hash prefix from `raas token list` (>= 8 hex)."""
    from app.auth import token_digest
    from core.db import session_scope
    from core.models import ApiToken

    key = token_or_hash_prefix
    with session_scope(load_settings().db_url) as s:
        ids = set(s.scalars(select(ApiToken.id).where(ApiToken.id == token_digest(key))).all())
        if len(key) >= 8 and all(c in "0123456789abcdef" for c in key):
            ids |= set(s.scalars(select(ApiToken.id).where(ApiToken.id.startswith(key))).all())
        if len(ids) != 1:
            raise click.ClickException(f"{len(ids)} tokens match {key!r}; nothing removed")
        s.execute(delete(ApiToken).where(ApiToken.id.in_(ids)))
    click.echo("removed")
