"""A verified weight push to an owner's pool: pause → apply → reset cache → verify → record the
version → resume, or stay paused if any server does not serve the trainer's weights.

The steps on one server are `agents.llm.weights`; the pause is `tasks.llm.pool_pause`. The probe
runs once before the load too: it warms the prefix cache with the old weights, so a server
whose cache was not reset serves stale logprobs and fails the verification instead of passing
by luck. Servers are handled one after the other (a push is ~1 s per server on CPU).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

from agents.llm.backends import ServerError
from agents.llm.tokenizer import list_models
from agents.llm.weights import (
    Fingerprint,
    ProbeCheck,
    apply_weights,
    check_mechanism,
    refuse_tied,
    reset_prefix_cache,
    verify,
)
from core.errors import InvalidRequest, WeightPushFailed
from tasks.llm import pool_pause

log = logging.getLogger(__name__)


@dataclass
class ServerPushReport:
    """One server's push (wire: `raas_client.weight_models.ServerPushReport`)."""

    id: str
    url: str
    ok: bool = False
    error: str | None = None
    generating_at_pause: int = 0
    pause_seconds: float = 0.0
    load_seconds: float | None = None
    verify_seconds: float | None = None
    total_seconds: float = 0.0
    before_max_abs_diff: float | None = None
    check: ProbeCheck | None = None


@dataclass
class WeightPushReport:
    """A whole push (wire: `raas_client.weight_models.WeightPushReport`)."""

    version: str
    mechanism: str
    resumed: bool
    pause_seconds: float
    total_seconds: float
    servers: list[ServerPushReport]


RETRY_HINT = (
    "the pool stays paused on the servers above: fix the checkpoint (or the server) "
    "and push again, or POST /v1/llm/resume (`raas weights resume`) to serve the "
    "weights they hold now"
)


def push(
    db_url: str,
    owner: str,
    *,
    version: str,
    mechanism: str,
    path: str,
    probe: Fingerprint,
    tolerance: float = 1e-3,
    lora_name: str | None = None,
    ids: list[str] | None = None,
    timeout: float = 300.0,
    lease_timeout: float = 30.0,
) -> WeightPushReport:
    """Push `path` to the owner's servers (all, or `ids`); WeightPushFailed (409) if any
    server fails to load or to verify: then nothing resumes."""
    refuse_tied(path, mechanism)
    for server in pool_pause.target_servers(db_url, owner, ids):
        check_mechanism(server.backend, mechanism)  # before anything is paused
    started = time.monotonic()
    servers = pool_pause.pause(db_url, owner, ids, timeout, lease_timeout)
    pause_seconds = round(time.monotonic() - started, 4)
    reports = [_push_one(s, mechanism, path, lora_name, probe, tolerance) for s in servers]
    resumed = all(r.ok for r in reports)
    if resumed:
        pool_pause.resume(
            db_url,
            owner,
            [s.id for s in servers],
            weight_version=version,
            model=lora_name if mechanism == "lora" else None,
        )
    report = WeightPushReport(
        version=version,
        mechanism=mechanism,
        resumed=resumed,
        pause_seconds=pause_seconds,
        total_seconds=round(time.monotonic() - started, 4),
        servers=reports,
    )
    log.info(
        "weight push %s (%s) to %d servers: %s, pause %.3f s, total %.3f s",
        version,
        mechanism,
        len(reports),
        "verified" if resumed else "FAILED",
        pause_seconds,
        report.total_seconds,
    )
    if not resumed:
        failed = [r for r in reports if not r.ok]
        raise WeightPushFailed(
            f"weight push {version!r} failed on {len(failed)} of "
            f"{len(reports)} servers ({failed[0].url}: {failed[0].error}); "
            f"{RETRY_HINT}",
            **asdict(report),
        )
    return report


def _push_one(
    server: pool_pause.PoolServer,
    mechanism: str,
    path: str,
    lora_name: str | None,
    probe: Fingerprint,
    tolerance: float,
) -> ServerPushReport:
    """Apply, reset and verify on one paused server (a failure is recorded, not raised)."""
    started = time.monotonic()
    report = ServerPushReport(
        id=server.id,
        url=server.url,
        pause_seconds=server.paused_seconds,
        generating_at_pause=server.generating_at_pause,
    )
    model = lora_name if mechanism == "lora" else (server.model or _served_model(server.url))
    try:
        report.before_max_abs_diff = _probe_before(server, model, probe, tolerance)
        report.load_seconds = round(apply_weights(server.url, server.backend, mechanism, path, lora_name), 4)
        reset_prefix_cache(server.url, server.backend)
        checked = time.monotonic()
        report.check = verify(server.url, server.backend, model, probe, tolerance)
        report.verify_seconds = round(time.monotonic() - checked, 4)
        report.ok = report.check.ok
        if not report.ok:
            report.error = _mismatch(report.check.first_mismatch, report.check.max_abs_diff, tolerance)
    except (ServerError, InvalidRequest) as exc:
        report.error = exc.message
    report.total_seconds = round(server.paused_seconds + time.monotonic() - started, 4)
    return report


def _probe_before(
    server: pool_pause.PoolServer, model: str | None, probe: Fingerprint, tolerance: float
) -> float | None:
    """The probe on the old weights: fills the prefix cache with them (see the module doc)."""
    try:
        return verify(server.url, server.backend, model, probe, tolerance).max_abs_diff
    except (ServerError, InvalidRequest) as exc:  # e.g. a LoRA name not loaded yet
        log.info("probe before loading on %s: %s", server.url, exc)
        return None


def _mismatch(first: int | None, worst: float | None, tolerance: float) -> str:
    """Why a verification failed, in words."""
    if first is not None:
        return (
            f"the served greedy tokens differ from the trainer's at position {first}: "
            "the server does not serve the pushed weights"
        )
    return (
        f"served logprobs differ from the trainer's by up to {worst:.3g} nats "
        f"(tolerance {tolerance:g}): stale weights, a stale prefix cache, a tied lm_head "
        "or another dtype"
    )


def _served_model(url: str) -> str | None:
    """The first model the server lists (what a request must name)."""
    models = list_models(url)
    return models[0].get("id") if models else None
