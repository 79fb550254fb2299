"""Job callbacks: a signed POST to the job's `callback_url` when a group or the job completes.

The pipeline never calls out. A completion writes a `callbacks` row in the same transaction
that completes the group or the job (`on_completions`, the outbox); the `CallbackDispatcher`
thread (a part of each reaper, `Reaper.parts`, started beside its passes, never inside one)
takes due rows and POSTs them, at least once: a failed or slow endpoint is retried with exponential backoff up to
`callback_max_attempts`, and costs the pipeline nothing.

Signing: every owner has its own secret, `HMAC-SHA256(callback_key, "raas-callback:" + owner)`
(hex), which the owner reads with `GET /v1/callbacks/secret`; the operator sets one
`RAAS_CALLBACK_KEY` (else a random key is made once in `<home>/callback.key`; every gateway
and reaper of a deployment must share it). A request carries

    X-Raas-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>
    X-Raas-Delivery: <callback id>      (the same on every retry: deduplicate on it)
    X-Raas-Event: group | job

and the receiver checks it with the SDK's `raas_client.sdk.verify_callback` (signature and the
timestamp's age): the verifying side lives only with the trainers that run it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from core.db import session_scope
from core.models import Callback, utcnow
from core.settings import Settings

log = logging.getLogger(__name__)
PLAIN = {"synchronize_session": False}
CLAIM_SECONDS = 60.0  # a taken delivery is not taken again this long (its POST is bounded)


def on_completions(
    s: Session, job_id: str, owner: str, url: str | None, *, group: dict[str, Any] | None = None, job_done: bool = False
) -> None:
    """Queue the callbacks a completion causes (inside the completing transaction)."""
    if not url:
        return
    now = utcnow()
    rows = []
    if group is not None:
        rows.append({"event": "group", "payload": {"event": "group", "job_id": job_id, "group": group}})
    if job_done:
        rows.append({"event": "job", "payload": {"event": "job", "job_id": job_id}})
    s.execute(
        insert(Callback),
        [
            {**r, "job_id": job_id, "owner": owner, "url": url, "attempts": 0, "next_at": now, "created_at": now}
            for r in rows
        ],
    )


def callback_key(settings: Settings) -> bytes:
    """The operator's key: the setting, else a random one kept in the home folder."""
    if settings.callback_key:
        return settings.callback_key.encode()
    path = Path(settings.home).resolve() / "callback.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(path, "x") as f:  # the first process to make it wins
                f.write(secrets.token_hex(32))
            path.chmod(0o600)
        except FileExistsError:
            pass
    return path.read_text().strip().encode()


def owner_secret(settings: Settings, owner: str) -> str:
    """The secret an owner's callbacks are signed with (hex)."""
    return hmac.new(callback_key(settings), f"raas-callback:{owner}".encode(), hashlib.sha256).hexdigest()


def signature(secret: str, body: bytes, timestamp: int) -> str:
    """The `X-Raas-Signature` header value for `body` sent at `timestamp`."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def backoff(attempts: int, cap: float) -> float:
    """Seconds before delivery number `attempts + 1`: 1, 2, 4, ... capped."""
    return min(cap, 2.0 ** max(0, attempts - 1))


def deliver_due(settings: Settings, client: httpx.Client, limit: int = 50) -> int:
    """POST the due callbacks this process takes; returns how many were delivered."""
    delivered = 0
    for row in _take_due(settings.db_url, limit):
        body = json.dumps({**row.payload, "delivery": row.id}, sort_keys=True).encode()
        headers = {
            "Content-Type": "application/json",
            "X-Raas-Event": row.event,
            "X-Raas-Delivery": str(row.id),
            "X-Raas-Signature": signature(owner_secret(settings, row.owner), body, int(time.time())),
        }
        try:
            answer = client.post(row.url, content=body, headers=headers, timeout=settings.callback_timeout)
            error = None if answer.is_success else f"HTTP {answer.status_code}"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        _settle(settings, row, error)
        delivered += error is None
    return delivered


def _take_due(db_url: str, limit: int) -> list[Any]:
    """Due rows, each taken by moving its `next_at` (one dispatcher wins each row)."""
    now = utcnow()
    with session_scope(db_url) as s:
        due = s.execute(
            select(Callback.id, Callback.next_at).where(Callback.next_at <= now).order_by(Callback.next_at).limit(limit)
        ).all()
        taken = []
        for cid, next_at in due:
            row = s.execute(
                update(Callback)
                .where(Callback.id == cid, Callback.next_at == next_at)
                .values(next_at=now + timedelta(seconds=CLAIM_SECONDS))
                .returning(
                    Callback.id, Callback.owner, Callback.url, Callback.event, Callback.payload, Callback.attempts
                ),
                execution_options=PLAIN,
            ).one_or_none()
            if row is not None:
                taken.append(row)
        return taken


def _settle(settings: Settings, row: Any, error: str | None) -> None:
    attempts = row.attempts + 1
    now = utcnow()
    if error is None:
        values: dict[str, Any] = {"delivered_at": now, "next_at": None, "last_error": None}
    elif attempts >= settings.callback_max_attempts:
        log.warning(
            "callback %s of job %s to %s given up after %s attempts: %s",
            row.id,
            row.payload.get("job_id"),
            row.url,
            attempts,
            error,
        )
        values = {"next_at": None, "last_error": error[:4000]}
    else:
        wait = backoff(attempts, settings.callback_backoff_max)
        log.info("callback %s to %s failed (%s); retry in %.0f s", row.id, row.url, error, wait)
        values = {"next_at": now + timedelta(seconds=wait), "last_error": error[:4000]}
    with session_scope(settings.db_url) as s:
        s.execute(
            update(Callback).where(Callback.id == row.id).values(attempts=attempts, **values), execution_options=PLAIN
        )


class CallbackDispatcher:
    """A daemon thread delivering due callbacks every `callback_interval` seconds."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> CallbackDispatcher:
        """Start the thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="raas-callbacks", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """End the loop after the current look."""
        self._stop.set()

    def _loop(self) -> None:
        with httpx.Client(follow_redirects=False) as client:
            while not self._stop.is_set():
                try:
                    while deliver_due(self.settings, client) and not self._stop.is_set():
                        pass
                except Exception:  # a database outage: the rows wait, nothing is lost
                    log.exception("callback dispatcher pass failed")
                self._stop.wait(self.settings.callback_interval)
