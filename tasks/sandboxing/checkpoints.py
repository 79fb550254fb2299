"""A rollout's workspace checkpoints in the pipeline (issue 41): where they live, who writes,
restores and removes them.

`<checkpoints>/<rollout>/<attempt>/` (`Settings.checkpoints`, shared storage on a cluster)
holds `manifest.json`, the workspace as INIT left it (`take_manifest`, after the hand-over to
the sandbox's uid), and `checkpoint.tar`, the latest good checkpoint of that attempt, written
by RUN after every turn (`RolloutCheckpoints.save`, `sandbox.checkpoint`). A later attempt
whose sandbox was rebuilt restores it (`RolloutCheckpoints.restore`) and replays only the
logged turns after it (`agents.loop_replay`).

A forked workspace (`tasks.sandboxing.group_layers`: a copy-on-write overlay, or a copy of the
group's layer) gets no manifest, only the reason, and its rollout replays: while an overlay
fork runs the host sees its upper layer only, not the workspace the agent sees.

The rollout's folder goes when its RUN is over (handed to EVAL, or the rollout ended:
`remove`), and the reaper removes those of rollouts no longer waiting for or in INIT or RUN
(`sweep`), so nothing is left behind by a worker that died at the wrong moment.
"""

from __future__ import annotations

import logging
import shutil
import tarfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

from core.db import session_scope
from core.errors import ResumeError
from core.models import Rollout, Status
from core.settings import Settings
from sandbox.checkpoint import CheckpointError, read_manifest, save, scan, write_manifest
from sandbox.checkpoint_restore import RestoreIncomplete, read_meta, restore

log = logging.getLogger(__name__)

MANIFEST, CHECKPOINT = "manifest.json", "checkpoint.tar"
NEEDED = (Status.PENDING.value, Status.INIT.value, Status.RUN.value)  # a resume may still restore


def folder(settings: Settings, rollout_id: str, attempt: int) -> Path:
    """The folder of one attempt's manifest and checkpoint."""
    return settings.checkpoints / rollout_id / str(attempt)


def take_manifest(settings: Settings, rollout_id: str, attempt: int, workspace: str, forked: bool) -> None:
    """INIT's manifest of the workspace it leaves (a forked one: only the reason it has none)."""
    where = folder(settings, rollout_id, attempt)
    settings.checkpoints.mkdir(mode=0o700, parents=True, exist_ok=True)  # workspaces' content: ours only
    where.mkdir(parents=True, exist_ok=True)
    if forked:
        (where / "skipped").write_text("forked workspace")
        return
    started = time.monotonic()
    try:
        manifest = scan(workspace)
        write_manifest(manifest, where / MANIFEST)
    except OSError as exc:  # no checkpoints for this attempt; a resume replays, as without them
        log.warning("rollout %s: no workspace manifest (%s); its checkpoints are off", rollout_id, exc)
        (where / "skipped").write_text(f"no manifest: {exc}")
        return
    log.info("rollout %s: workspace manifest, %d entries, %.3fs", rollout_id, len(manifest), time.monotonic() - started)


def remove(settings: Settings, rollout_id: str) -> None:
    """Delete every checkpoint of a rollout (its RUN is over)."""
    shutil.rmtree(settings.checkpoints / rollout_id, ignore_errors=True)


def for_run(
    settings: Settings, rollout_id: str, attempt: int, handle: dict[str, Any] | None, policy: Any
) -> RolloutCheckpoints | None:
    """RUN's checkpoints under the job's `resume` policy (None: the rollout has no workspace)."""
    if not (handle and handle.get("workspace")):
        return None
    uid = handle.get("uid")
    return RolloutCheckpoints(
        settings,
        rollout_id,
        attempt,
        handle["workspace"],
        int(uid) if uid is not None else None,
        policy.checkpoint_max_bytes,
    )


class RolloutCheckpoints:
    """One RUN's checkpoints (`agents.contexts.WorkspaceCheckpoints`): saved after each turn
    into this attempt's folder, an earlier attempt's restored into this fresh workspace."""

    def __init__(
        self, settings: Settings, rollout_id: str, attempt: int, workspace: str, uid: int | None, max_bytes: int
    ) -> None:
        self.settings, self.rollout_id, self.attempt = settings, rollout_id, attempt
        self.workspace, self.uid, self.max_bytes = workspace, uid, max_bytes
        self.here = folder(settings, rollout_id, attempt)
        self._manifest: dict | None = None
        self.unavailable: str | None = None  # why this attempt saves none

    def _loaded(self) -> dict | None:
        if self._manifest is None and self.unavailable is None:
            skipped = self.here / "skipped"
            try:
                if skipped.exists():
                    self.unavailable = skipped.read_text()
                else:
                    self._manifest = read_manifest(self.here / MANIFEST)
            except (OSError, ValueError) as exc:
                self.unavailable = f"no manifest: {exc}"
            if self.unavailable:
                log.info(
                    "rollout %s: no workspace checkpoints (%s); a resume replays", self.rollout_id, self.unavailable
                )
        return self._manifest

    def save(self, turn: int, counts: dict[str, Any]) -> None:
        """Checkpoint the workspace after `turn`, counting what happened in `counts` (the
        episode's `metrics.checkpoints`)."""
        manifest = self._loaded()
        if manifest is None:
            counts["unavailable"] = self.unavailable
            return
        saved = save(self.workspace, manifest, self.here / CHECKPOINT, turn, self.max_bytes)
        if saved.written:
            counts["saved"] = counts.get("saved", 0) + 1
            counts["turn"], counts["bytes"] = turn, saved.bytes
            counts["max_seconds"] = round(max(counts.get("max_seconds", 0.0), saved.seconds), 4)
            if counts["saved"] == 1:
                self._drop_earlier_attempts()
            return
        key = "skipped_over_bound" if saved.skipped == "over_bound" else "failed"
        counts[key] = counts.get(key, 0) + 1
        log.info(
            "rollout %s: no checkpoint after turn %d (%s, %d bytes)", self.rollout_id, turn, saved.skipped, saved.bytes
        )

    def restore(self, attempt: int, last_logged: int, counts: dict[str, Any]) -> int:
        """Restore the latest checkpoint of `attempt` into this fresh workspace; the turn it was
        taken after, or -1 (nothing restored: the caller replays every turn) with the reason in
        `counts["restore_skipped"]`."""
        source = folder(self.settings, self.rollout_id, attempt) / CHECKPOINT
        reason = None
        if self._loaded() is None:
            reason = self.unavailable  # a forked workspace: the host does not see what the agent does
        elif not source.exists():
            reason = f"attempt {attempt} left no checkpoint here"
        else:
            try:
                turn = int(read_meta(source)["turn"])
                if turn > last_logged:  # its turn's log was lost with the worker
                    reason = f"checkpoint of turn {turn} is ahead of the log (turn {last_logged})"
                else:
                    done = restore(self.workspace, source, self.uid)
                    counts["restored"] = {"attempt": attempt, "turn": turn, "seconds": round(done.seconds, 4)}
                    log.info("rollout %s: restored attempt %d's checkpoint of turn %d", self.rollout_id, attempt, turn)
                    return turn
            except RestoreIncomplete as exc:  # neither fresh nor restored: replay would be wrong
                raise ResumeError(f"workspace checkpoint of attempt {attempt}: {exc}") from exc
            except (OSError, CheckpointError, tarfile.TarError, KeyError, ValueError) as exc:
                reason = f"unusable: {exc}"
        counts["restore_skipped"] = reason
        log.warning("rollout %s: checkpoint not restored (%s); replaying every turn", self.rollout_id, reason)
        return -1

    def _drop_earlier_attempts(self) -> None:
        """This attempt has a checkpoint of its own: an earlier one's will never be read."""
        for other in (self.settings.checkpoints / self.rollout_id).glob("*"):
            if other.name.isdigit() and int(other.name) < self.attempt:
                shutil.rmtree(other, ignore_errors=True)


def sweep(settings: Settings, db_url: str) -> int:
    """Remove the checkpoint folders of rollouts that no longer wait for or run INIT or RUN
    (ended, in EVAL, or unknown); how many were removed."""
    root = settings.checkpoints
    try:
        ids = [p.name for p in root.iterdir() if p.is_dir()]
    except FileNotFoundError:
        return 0
    if not ids:
        return 0
    with session_scope(db_url) as s:
        live = set(s.scalars(select(Rollout.id).where(Rollout.id.in_(ids), Rollout.status.in_(NEEDED))))
    gone = [i for i in ids if i not in live]
    for rollout_id in gone:
        shutil.rmtree(root / rollout_id, ignore_errors=True)
    return len(gone)
