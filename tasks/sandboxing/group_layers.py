"""INIT once per instance: the samples of a GRPO group fork one prepared workspace (issue 38).

A job forks its groups when `sandbox.group_fork` says so, or by default when its handler
declares its INIT forkable (`AgentHandler.forkable_init`: what `init` leaves in the workspace
does not depend on the sample or on the workspace's path). Then on each node the first sample
of an instance to reach INIT prepares the group's *layer*: a sandbox whose workspace, once
`handler.init` has filled it and the sandbox is stopped, becomes the read-only lower folder.
Every sample (the preparer too) then starts its own sandbox on a copy-on-write fork of it
(`tasks.sandboxing.sandboxes.start_fork`) and runs `handler.init_fork` for its own state.

The `group_layers` row (one per job, instance and node) is the coordination: the preparer
inserts it (the unique key lets one insert win) or takes over a `failed` or `removed` one, or
a `preparing` one whose lease stopped beating (a killed worker, a lost node), each by a
conditional UPDATE fenced on the lease it saw; it beats while it works. The others poll until
it is `ready`, within their INIT deadline and cancel. The reaper (`sweep`) removes a layer once
no sample of its group waits for or is in INIT or RUN, and any layer folder no live row names.

Where overlays cannot be mounted (`Runtime.overlay_unavailable_reason`) each sample gets a copy
of the layer instead (reflinks where the filesystem has them): the instance's work is still
done once, its disk is paid per sample.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import exists, insert, select, update
from sqlalchemy.exc import IntegrityError

from core.db import session_scope
from core.errors import InfraError, InvalidRequest
from core.models import GroupLayer, LayerStatus, Rollout, Status, utcnow
from core.settings import Settings
from tasks.sandboxing import sandboxes

log = logging.getLogger(__name__)
LAYERS_DIR = "layers"  # under the node's workspaces: one folder per preparation
# A waiting sample watches the layer's folder appear (a stat, every FOLDER_POLL_SECONDS: the
# preparer moves it into place as its last step) and reads the row only every ROW_POLL_SECONDS
# (for a preparer that died or failed): n - 1 waiters cost the database almost nothing.
FOLDER_POLL_SECONDS = 0.02
ROW_POLL_SECONDS = 1.0
# Statuses in which a sample may still start a sandbox over its group's layer, or read it.
USING = (Status.PENDING.value, Status.INIT.value, Status.RUN.value)
PLAIN = {"synchronize_session": False}


@dataclass(frozen=True)
class Layer:
    """A group's prepared folder on this node and how samples fork it."""

    id: str
    path: str
    mode: str  # "overlay" or "copy"


def wanted(config: Any, handler: Any, runtime: str, samples: int = 2) -> bool:
    """Whether this rollout's INIT forks its group's layer: the job's choice, else the
    handler's declaration when the job has groups (`samples` per instance > 1: one sample
    alone would pay a preparation and a fork for nothing); a job may not fork a handler whose
    INIT is not forkable."""
    if runtime == "none":
        return False
    chosen = config.sandbox.group_fork
    if chosen and not handler.forkable_init:
        raise InvalidRequest(f"agent {handler.name!r} does not declare its INIT forkable", field="sandbox.group_fork")
    return handler.forkable_init and samples > 1 if chosen is None else chosen


def overlay_refusal(runtime: str) -> str | None:
    """Why `runtime` ("auto" as `sandbox.get_runtime` resolves it) cannot mount a fork's
    overlay on this node, or None when it can (tried once per process)."""
    from sandbox.registry import registered

    if runtime == "auto":  # bwrap when usable, else local
        runtime = "bwrap" if registered("bwrap").unavailable_reason() is None else "local"
    cls = registered(runtime)
    return f"unknown runtime {runtime!r}" if cls is None else cls.overlay_unavailable_reason()


def fork_mode(runtime: str) -> str:
    """How samples fork a layer here: "overlay" (copy-on-write) where the runtime mounts it,
    else "copy"."""
    return "overlay" if overlay_refusal(runtime) is None else "copy"


def layers_root(settings: Settings) -> Path:
    """Where this node's group layers live (beside the workspaces: same filesystem)."""
    return settings.workspaces / LAYERS_DIR


# -- the row -------------------------------------------------------------------------------
def _acquire(settings: Settings, job_id: str, instance_id: str, token: str) -> tuple[GroupLayer, bool]:
    """(row, True) when this caller must prepare the layer (it inserted the row, or took over
    a failed, removed or stale one); else (row, False): ready, or a live preparer's (wait)."""
    db, node = settings.db_url, settings.node
    key = (GroupLayer.job_id == job_id, GroupLayer.instance_id == instance_id, GroupLayer.node == node)
    with session_scope(db) as s:
        row = s.execute(select(GroupLayer).where(*key)).scalar_one_or_none()
        if row is not None:
            s.expunge(row)
    layer_id = row.id if row is not None else uuid.uuid4().hex
    path = str(layers_root(settings) / f"{layer_id}-{token[:12]}")
    mine = {"status": LayerStatus.PREPARING.value, "lease_owner": token, "heartbeat_at": utcnow(), "path": path}
    if row is None:
        try:
            with session_scope(db) as s:
                s.execute(
                    insert(GroupLayer).values(id=layer_id, job_id=job_id, instance_id=instance_id, node=node, **mine)
                )
        except IntegrityError:  # another sample inserted it first: look again
            return _acquire(settings, job_id, instance_id, token)
        return GroupLayer(id=layer_id, **mine), True
    stale = utcnow() - timedelta(seconds=settings.lease_timeout)
    if row.status in (LayerStatus.FAILED.value, LayerStatus.REMOVED.value) or (
        row.status == LayerStatus.PREPARING.value and row.heartbeat_at is not None and _aware(row.heartbeat_at) < stale
    ):
        fence = [GroupLayer.id == row.id, GroupLayer.status == row.status]
        fence.append(GroupLayer.lease_owner == row.lease_owner if row.lease_owner else GroupLayer.lease_owner.is_(None))
        if row.status == LayerStatus.PREPARING.value:  # still stale at the UPDATE itself
            fence.append(GroupLayer.heartbeat_at < stale)
        with session_scope(db) as s:
            taken = s.execute(update(GroupLayer).where(*fence).values(**mine), execution_options=PLAIN).rowcount
        if taken:
            log.info("group layer %s: taking over its preparation (was %s)", row.id, row.status)
            return GroupLayer(id=row.id, **mine), True
    return row, False


def _aware(value: Any) -> Any:
    """SQLite hands datetimes back naive (they were written in UTC)."""
    from datetime import timezone

    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def _settle_row(db: str, layer_id: str, token: str, **values: Any) -> bool:
    """End this preparation (ready or failed) if its lease is still this one's."""
    with session_scope(db) as s:
        return bool(
            s.execute(
                update(GroupLayer)
                .where(
                    GroupLayer.id == layer_id,
                    GroupLayer.lease_owner == token,
                    GroupLayer.status == LayerStatus.PREPARING.value,
                )
                .values(lease_owner=None, **values),
                execution_options=PLAIN,
            ).rowcount
        )


class _Beat:
    """Beats a preparation's lease on a thread until stopped (the preparer is alive)."""

    def __init__(self, db: str, layer_id: str, token: str, interval: float) -> None:
        self.db, self.layer_id, self.token, self.interval = db, layer_id, token, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="raas-layer-beat")

    def __enter__(self) -> _Beat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                with session_scope(self.db) as s:
                    s.execute(
                        update(GroupLayer)
                        .where(GroupLayer.id == self.layer_id, GroupLayer.lease_owner == self.token)
                        .values(heartbeat_at=utcnow()),
                        execution_options=PLAIN,
                    )
            except Exception:  # a missed beat is retried; a stale one is taken over
                log.warning("beating group layer %s failed", self.layer_id, exc_info=True)


# -- INIT ----------------------------------------------------------------------------------
def layer_for(settings: Settings, ctx: Any, job_id: str, prepare: Any) -> Layer:
    """The group's ready layer on this node: prepared here (`prepare(path)`) when this sample
    wins the row, else waited for; raises what `ctx.checkpoint` raises (cancel, deadline)."""
    token = uuid.uuid4().hex
    while True:
        row, mine = _acquire(settings, job_id, ctx.instance_id, token)
        if mine:
            return _prepare(settings, row, token, prepare)
        if row.status == LayerStatus.READY.value and row.path and os.path.isdir(row.path):
            return Layer(row.id, row.path, row.mode or "overlay")
        ctx.checkpoint()
        _watch_folder(row.path, ctx)


def _watch_folder(path: str | None, ctx: Any) -> None:
    """Wait until the layer's folder is in place (then its row says ready within a moment)
    or ROW_POLL_SECONDS passed; a folder already there waits one folder poll (its row is
    being written)."""
    if path and os.path.isdir(path):
        time.sleep(FOLDER_POLL_SECONDS)
        return
    end = time.monotonic() + min(ROW_POLL_SECONDS, max(0.0, ctx.deadline - time.monotonic()))
    while time.monotonic() < end:
        time.sleep(FOLDER_POLL_SECONDS)
        if path and os.path.isdir(path):
            return


def _prepare(settings: Settings, row: GroupLayer, token: str, prepare: Any) -> Layer:
    started, mode = time.monotonic(), None
    path = str(row.path)
    try:
        with _Beat(settings.db_url, row.id, token, settings.heartbeat_interval):
            mode = prepare(path)
    except BaseException as exc:
        _settle_row(settings.db_url, row.id, token, status=LayerStatus.FAILED.value, error=str(exc)[:2000])
        from sandbox.overlay import remove_tree

        remove_tree(path)
        raise
    seconds = round(time.monotonic() - started, 6)
    if not _settle_row(
        settings.db_url, row.id, token, status=LayerStatus.READY.value, mode=mode, prepared_seconds=seconds, error=None
    ):  # taken over meanwhile (this preparer looked dead): its folder is nobody's
        raise InfraError(f"group layer {row.id}: the preparation lost its lease")
    log.info("group layer %s prepared in %.3fs (%s)", row.id, seconds, mode)
    return Layer(row.id, path, mode)


def sample_sandbox(
    settings: Settings,
    handler: Any,
    ctx: Any,
    job_id: str,
    options: dict[str, Any],
    runtime: str,
    attempt: int,
    samples: int = 1,
) -> tuple[Any, dict[str, Any]]:
    """A group sample's sandbox: a fork of its group's layer, prepared first if nobody has
    (meanwhile this process's pool starts fork slots for the group's `samples`)."""
    rollout_id = ctx.rollout_id
    group = f"{job_id}/{ctx.instance_id}"

    def prepare(path: str) -> str:
        prepare_layer(settings, handler, ctx, options, runtime, attempt, path)
        return fork_mode(runtime)

    sandboxes.want_forks(settings, options, runtime, layers_root(settings), group, samples)
    layer = layer_for(settings, ctx, job_id, prepare)
    started = time.monotonic()
    sb, handle = sandboxes.start_fork(settings, options, rollout_id, attempt, runtime, layer.path, layer.mode, group)
    # which layer, and how long this sample's start took once the layer was there
    handle.update(group_layer=layer.id, fork_seconds=round(time.monotonic() - started, 6))
    return sb, handle


def prepare_layer(
    settings: Settings, handler: Any, ctx: Any, options: dict[str, Any], runtime: str, attempt: int, path: str
) -> None:
    """Run the handler's INIT in a sandbox of the group's shape (a warm one when the pool has
    it), stop it, and move its workspace to `path`: the lower layer, the sandbox uid's."""
    sb, handle = sandboxes.start(settings, options, ctx.rollout_id, attempt, runtime)
    try:
        handler.init(dataclasses.replace(ctx, state={}).with_sandbox(sb, handle.get("workspace")))
        sandboxes.stop(handle)  # nothing it started may write to the layer any more
        sandboxes.hand_over(handle)  # the sandbox uid's: its forks' copies-up keep the owner
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        os.rename(handle["workspace"], path)  # last: waiters watch for the folder
    finally:
        sandboxes.release(handle)  # the sandbox, and a pool slot's claim record


# -- the reaper ----------------------------------------------------------------------------
def sweep(settings: Settings) -> int:
    """Remove this node's layers no sample of their group can use any more, and layer folders
    no live row names; returns how many layers were removed."""
    from sandbox.overlay import remove_tree

    db, node = settings.db_url, settings.node
    root = layers_root(settings)
    try:  # listed before the query: a folder listed here had its row committed before it
        names = os.listdir(root)
    except FileNotFoundError:
        names = []
    in_use = exists().where(
        Rollout.job_id == GroupLayer.job_id,
        Rollout.instance_id == GroupLayer.instance_id,
        Rollout.status.in_(USING),
    )
    with session_scope(db) as s:
        done = s.execute(
            update(GroupLayer)
            .where(GroupLayer.node == node, GroupLayer.status == LayerStatus.READY.value, ~in_use)
            .values(status=LayerStatus.REMOVED.value)
            .returning(GroupLayer.id, GroupLayer.path),
            execution_options=PLAIN,
        ).all()
        live = set(
            s.scalars(
                select(GroupLayer.path).where(
                    GroupLayer.node == node,
                    GroupLayer.status.in_([LayerStatus.PREPARING.value, LayerStatus.READY.value]),
                )
            )
        )
    for row in done:
        log.info("group layer %s: its group is past RUN; removing %s", row.id, row.path)
    for name in names:
        if str(root / name) not in live:
            remove_tree(root / name)
    return len(done)
