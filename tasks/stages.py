"""The three stage tasks (INIT, RUN, EVAL) and what happens around the handler's hooks.

Each task takes ids, claims its rollout with a conditional UPDATE (a duplicate delivery finds
nothing to claim and exits), beats while it works, and ends by handing the rollout to the next
stage's queue on this node or by a terminal write. Deadlines start at the claim, so time spent
queued never counts against the agent. No database transaction is held while a hook runs.
What lives as long as the worker process (its heartbeat, turn log, mark clearer, memory of
cancelled jobs, ...) is reached through the process's parts, `app.raas_parts` (`tasks.worker`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import uuid
from typing import Any

from celery import shared_task
from sqlalchemy.exc import OperationalError

from raas_client.models import Trajectory

from agents.abstract import AgentHandler, EvalResult
from agents.contexts import RolloutContext
from agents.finish_reasons import POLICY_DEADLINE
from agents.job_config import JobConfig
from agents.registry import get_handler
from core.errors import (
    AgentError,
    LeaseLost,
    ResumeError,
    RolloutCancelled,
    StageTimeout,
)
from core.models import Job, Outcome, Status
from tasks.writes import groups, lifecycle, terminal
from tasks.recovery import drain, handback, resume
from tasks.sandboxing import checkpoints, grading, group_layers, sandboxes
from tasks.contexts import eval_context, llm_session, rollout_context
from tasks.broker.config import TASK_NAMES
from tasks.process.parts import ProcessParts
from tasks.recovery.handback import LiveQueues
from tasks.recovery.heartbeat import Heartbeater
from tasks.writes.cancels import CancelMemory
from tasks.writes.outbox_marks import Mark, MarkClearer
from tasks.stage_records import RETRYABLE, describe, divergences, run_fields, ungraded
from tasks.writes.run_turns import RunTurns
from tasks.writes.turn_log import TurnLog
from tasks.broker.publish import publish

logger = logging.getLogger(__name__)


class RolloutLog(logging.LoggerAdapter):
    """Puts the job and rollout id on every record of a stage."""

    def process(self, msg: str, kwargs: Any) -> tuple[str, Any]:
        return f"[job={self.extra['job']} rollout={self.extra['rollout']}] {msg}", kwargs


class StageRun:
    """One execution of one stage for one rollout attempt."""

    def __init__(self, app: Any, stage: str, rollout_id: str, attempt: int) -> None:
        self.app = app
        self.settings = app.raas_settings
        self.parts: ProcessParts = app.raas_parts  # the worker process's long-lived parts
        self.db = self.settings.db_url
        self.stage = stage
        self.rollout_id = rollout_id
        self.attempt = attempt
        self.lease = f"{self.settings.node}/{os.getpid()}/{uuid.uuid4().hex[:12]}"
        self.log: logging.LoggerAdapter = RolloutLog(logger, {"job": "?", "rollout": rollout_id})
        self.rollout: Any  # the claimed row as a plain record (`lifecycle.claim`)
        self.job: Job
        self.handler: AgentHandler | None = None
        self.ctx: RolloutContext | None = None  # the stage's own once it has one
        self.beats: Heartbeater | None = None  # this process's, once the rollout is claimed
        self.started = time.monotonic()
        # Set once the rollout may belong to the next stage: its sandbox is no longer ours
        # to release, whatever fails afterwards.
        self.handed_on = False

    def execute(self, job: str | None = None) -> None:
        """Claim, run the stage under a heartbeat, and record how it ended."""
        if not self.parts.get(drain.Intake).accepting(self.stage):  # the pool drains: someone else takes it
            drain.decline(self.app, self.stage, self.rollout_id, self.attempt)
            return
        claimed = lifecycle.claim(self.db, self.rollout_id, self.attempt, self.stage, self.lease, self.settings.node)
        if claimed is None:
            logger.info(
                "%s of %s attempt %s: nothing to claim (duplicate or stale)", self.stage, self.rollout_id, self.attempt
            )
            if job and self.stage == "init" and self.attempt == 1:
                self.parts.get(CancelMemory).note_if_cancelled(self.db, job)
            return
        self.rollout, self.job = claimed
        self.log = RolloutLog(logger, {"job": self.job.id, "rollout": self.rollout_id})
        self.beats = self.parts.get(Heartbeater)
        with self.beats.holding(self.lease):
            self._guarded()

    def _guarded(self) -> None:
        try:
            self.handler = get_handler(self.job.agent)
            self.ctx = self._context()
            if self.rollout.cancel_requested:
                raise RolloutCancelled("cancelled before the stage started")
            getattr(self, f"_{self.stage}")()
        except LeaseLost as exc:  # another attempt owns the rollout now: write nothing
            self.log.warning("%s stops: %s", self.stage, exc)
        except RolloutCancelled:
            self._end(Status.CANCELLED, Outcome.CANCELLED, "cancelled")
        except StageTimeout as exc:
            self._end(Status.FAILED, Outcome.TIMEOUT, f"{self.stage}: {exc}")
        except AgentError as exc:  # what the agent breaks is its failure: reward 0, not None
            self._end(Status.FAILED, Outcome.AGENT_ERROR, f"{self.stage}: {exc}", reward=0.0)
        except ResumeError as exc:  # the logged turns cannot rebuild the RUN: start over
            self._retry_or_fail(exc, may_resume=False)
        except RETRYABLE as exc:
            self._retry_or_fail(exc)
        except Exception as exc:
            self.log.exception("%s failed", self.stage)
            self._end(Status.FAILED, Outcome.INFRA_ERROR, describe(exc, self.stage))

    # -- context -------------------------------------------------------------------------
    def _context(self) -> RolloutContext:
        self.config = JobConfig.load(self.job.config)
        return rollout_context(
            self.settings,
            self.rollout,
            self.job,
            self.handler,
            stage=self.stage,
            attempt=self.attempt,
            started=self.started,
            cancel_check=self._cancel_seen,
            logger=self.log,
            config=self.config,
        )

    def _cancel_seen(self) -> bool:
        """Whether the rollout was asked to stop, as of the process's last heartbeat."""
        return self.beats is not None and self.beats.cancel_seen(self.lease)

    def _elapsed(self) -> float:
        return round(time.monotonic() - self.started, 6)

    # -- the stages ----------------------------------------------------------------------
    def _init(self) -> None:
        if self.job.group_size is not None:  # a straggler cut's deadline counts from here
            groups.start(self.db, self.job.id, self.rollout.instance_id)
        self.ctx = self.ctx.for_init(None, None)  # the overrides are asked before it starts
        needed = self.handler.sandbox_needed(self.ctx.agent_config)
        runtime = sandboxes.wanted_runtime(self.settings, self.config.sandbox, needed)
        forked = False
        if runtime != "none":
            options = sandboxes.merged_options(self.config.sandbox, self.handler.sandbox_overrides(self.ctx))
            # an attempt that replays logged turns (a branch's, or after a lost sandbox): its
            # workspace shown at the path they were logged in (the `local` runtime, with no
            # mount namespace, cannot: there a replay meets another path, which a branch refuses)
            if runtime != "local" or self.rollout.parent_rollout_id is not None:
                options.update(
                    resume.replayed_workspace(self.db, self.rollout, self.attempt, self._replayable(calls=True))
                )
            forked = group_layers.wanted(self.config, self.handler, runtime, self.job.n_samples)
            asked = time.monotonic()
            if forked:  # the group's layer, prepared once per node, forked copy-on-write
                sb, handle = group_layers.sample_sandbox(
                    self.settings,
                    self.handler,
                    self.ctx,
                    self.job.id,
                    options,
                    runtime,
                    self.attempt,
                    self.job.n_samples,
                )
            else:
                sb, handle = sandboxes.start(self.settings, options, self.rollout_id, self.attempt, runtime)
            self.rollout.sandbox = handle  # released by _end if anything below fails
            # how the sandbox came (a warm claim, a fork slot, a cold start) and what it cost
            started = sandboxes.start_metric(handle, handle.get("fork_seconds", time.monotonic() - asked))
            metrics = {**(self.rollout.metrics or {}), "sandbox_start": started}
            if not lifecycle.save(self.db, self.rollout_id, self.lease, sandbox=handle, metrics=metrics):
                sandboxes.release(handle)
                return
            self.ctx = self.ctx.with_sandbox(sb, handle.get("workspace"))
        (self.handler.init_fork if forked else self.handler.init)(self.ctx)
        sandboxes.hand_over(self.rollout.sandbox)  # what INIT wrote is the agent's to edit
        if self._checkpointed() and self.ctx.workspace:  # what a checkpoint's changes are since
            checkpoints.take_manifest(self.settings, self.rollout_id, self.attempt, self.ctx.workspace, forked)
        self._hand_on("run", state=self.ctx.state, init_seconds=self._elapsed())

    def _run(self) -> None:
        from tasks.sandboxing.run_guard import RunGuard

        handle = self.rollout.sandbox
        sandbox = sandboxes.attach(self.settings, handle)
        guard = RunGuard(handle, self.config.sandbox, self.parts.shutting_down)
        resume_turns = None
        # a lost RUN or sandbox logged these: continue after them (a harness: answered from them)
        if self.handler.resumable or self.handler.replays_calls:
            resume_turns = resume.turns_to_resume(self.db, self.rollout, self.attempt, self.config.resume.replay)
        turns = RunTurns(self.parts.get(TurnLog), self.db, self.rollout_id, self.attempt, self.lease, self.log)
        self.ctx = ctx = self.ctx.for_run(
            sandbox,
            # the path the agent is shown (a branch's is its parent's: `workspace_inside`)
            (handle or {}).get("workspace_inside") or (handle or {}).get("workspace"),
            llm=llm_session(
                self.settings, self.config, self.handler, self.job, self.db, self.lease, self.rollout, self.parts
            ),
            record_turn=turns.record,
            settle_turns=turns.settle,
            resume_turns=resume_turns,
            diagnose=guard.diagnose,
            # a drain hands back at a turn boundary only what a new attempt can replay
            **(
                {"turn_boundary": drain.TurnBoundary(self.settings.node, self.parts.get(drain.Intake))}
                if self._replayable()
                else {}
            ),
            checkpoints=checkpoints.for_run(self.settings, self.rollout_id, self.attempt, handle, self.config.resume)
            if self._checkpointed()
            else None,
        )
        try:
            with guard.watching():
                result = self.handler.run(ctx)
            result = guard.over_quota(result)
        except StageTimeout as exc:
            result = Trajectory.build(
                outcome=Outcome.TIMEOUT.value, finish_reason="deadline", metrics={"timeout": str(exc)}
            )
        except BaseException:
            turns.settle_quietly()  # a RUN that fails keeps every turn it produced
            raise
        finally:
            if ctx.llm is not None:
                ctx.llm.close()
        turns.settle()  # every turn durable before the rollout leaves this lease
        sandboxes.stop(handle)  # the agent's: nothing it started may live on into grading
        if ungraded(result):
            self._end_ungraded(result)
            return
        # read from the dead workspace, on the host
        artifact = self.handler.artifact(dataclasses.replace(ctx, workspace=(handle or {}).get("workspace")), result)
        self._hand_on(
            "eval",
            **run_fields(result, self.rollout.metrics),
            artifact=artifact,
            state=ctx.state,
            run_seconds=self._elapsed(),
        )
        sandboxes.release(handle)  # the workspace: its artifact is stored
        checkpoints.remove(self.settings, self.rollout_id)  # no resume restores a RUN that is over

    def _checkpointed(self) -> bool:
        """Whether this job's rollouts save workspace checkpoints (`resume.checkpoints`)."""
        return self._replayable() and self.config.resume.checkpoints

    def _replayable(self, calls: bool = False) -> bool:
        return resume.replays(self.handler, self.config, self.rollout, calls)

    def _end_ungraded(self, result: Trajectory) -> None:
        """End at RUN: a prompt that does not fit (reward null, not a sample), a harness the
        endpoint refused or that never started (infra_error, reward null), a sandbox the agent
        broke or a deadline its own actions ran out (agent_error, reward 0); the trajectory is
        kept either way."""
        fields = run_fields(result, self.rollout.metrics)
        outcome = fields.pop("outcome")
        if outcome == Outcome.PROMPT_TOO_LONG.value:
            reward = None
            error = (
                f"run: the prompt ({len(result.prompt_ids or [])} tokens) does not fit "
                f"the context ({result.metrics.get('context_length')} tokens)"
            )
        elif outcome == Outcome.INFRA_ERROR.value:
            refused = ", ".join(f"{name} x{n}" for name, n in (result.metrics.get("refusals") or {}).items())
            reason = f"{result.finish_reason}: refused {refused}" if refused else result.finish_reason
            reward, error = None, f"run: the harness did not run against its endpoint ({reason})"
        elif (outcome, result.finish_reason) == POLICY_DEADLINE:
            share = (result.metrics.get("time_split") or {}).get("agent_share")
            reward, error = 0.0, f"run: the deadline passed on the agent's own time (agent share {share})"
        else:
            reward, error = 0.0, f"run: the agent broke its sandbox ({result.finish_reason})"
        self.log.info("%s", error)
        sandboxes.release(self.rollout.sandbox)
        checkpoints.remove(self.settings, self.rollout_id)
        terminal.finish(
            self.db,
            self.rollout_id,
            Status.FAILED,
            outcome,
            lease=self.lease,
            group=self.job,
            error=error,
            reward=reward,
            state=self.ctx.state,
            run_seconds=self._elapsed(),
            **fields,
        )

    def _eval(self) -> None:
        self.ctx = eval_context(self.ctx, self.rollout)
        result: EvalResult = grading.grade(
            self.settings,
            self.handler,
            self.ctx,
            job_sandbox=self.config.sandbox,
            label=(self.rollout_id, self.attempt),
            workspace=self.settings.workspaces / f"{self.rollout_id}-{self.attempt}-eval",
            on_start=self._keep_sandbox,
        )
        terminal.finish(
            self.db,
            self.rollout_id,
            Status.DONE,
            self.rollout.outcome or Outcome.COMPLETED.value,
            lease=self.lease,
            group=self.job,
            reward=float(result.reward),
            eval_seconds=self._elapsed(),
            state=self.ctx.state,
            metrics={**(self.rollout.metrics or {}), **result.metrics},
            extra={**(self.rollout.extra or {}), **result.extra},
        )

    def _keep_sandbox(self, handle: dict[str, Any]) -> None:
        """Record the grading sandbox so the reaper and failure paths can stop it."""
        self.rollout.sandbox = handle
        lifecycle.save(self.db, self.rollout_id, self.lease, sandbox=handle)

    def _hand_on(self, stage: str, **values: Any) -> None:
        """Queue the next stage: RUN on this node (its sandbox is here), EVAL on this node
        while its EVAL pool consumes, else on a node whose pool does; a cancel that arrived
        meanwhile wins.

        The status change commits with an outbox mark; from then on the rollout and its
        sandbox belong to the next stage whether or not the message gets out (a broker that
        stays away past the retry budget leaves the message to the reaper's outbox drain).
        A database error during the commit leaves it unknown whether it committed, so the
        sandbox is kept then too (the reaper stops it if no stage ever uses it again).
        """
        self.handed_on = True
        node = self.settings.node
        if stage == "eval":  # any node can grade the stored artifact: one that takes EVALs
            try:
                node = handback.eval_node(self.settings, live=self.parts.get(LiveQueues).read()) or node
            except Exception as exc:  # noqa: BLE001 - the database is away: this node's
                self.log.info("EVAL target unknown (%s); this node's queue", exc)  # queue
            values["node"] = node
        handed, marked_at = lifecycle.hand_off(self.db, self.rollout_id, self.lease, stage, **values)
        if handed:
            self._deliver(
                stage,
                self.attempt,
                node,
                f"handed to {stage}" + ("" if node == self.settings.node else f" on {node}"),
                marked_at,
            )
            return
        self.handed_on = False  # refused: the rollout is still ours (or another attempt's)
        if lifecycle.cancel_requested(self.db, self.rollout_id):
            raise RolloutCancelled("cancelled during the stage")

    def _deliver(self, stage: str, attempt: int, node: str | None, what: str, marked_at: Any = False) -> None:
        """Publish a committed, marked hand-off; clear the mark once it is out (a hand-on's
        clear is queued: `tasks.writes.outbox_marks`). Never raises: a message that does not get
        out is the outbox's."""
        try:
            publish(
                self.app,
                stage,
                self.rollout_id,
                attempt,
                node,
                retry_seconds=self.settings.handoff_publish_seconds,
                priority=self.job.priority,
            )
        except Exception as exc:  # noqa: BLE001 - kombu's OperationalError after the retries, and the like
            self.log.warning("%s; publish deferred to the outbox: %s", what, describe(exc, "publish"))
            return
        queued = Status.PENDING.value if stage == "init" else stage
        if marked_at is not False:
            self.parts.get(MarkClearer).clear(Mark(self.rollout_id, attempt, queued, marked_at))
            return
        try:
            lifecycle.clear_mark(self.db, self.rollout_id, attempt, queued)
        except OperationalError as exc:  # the mark stays: at worst one duplicate message
            self.log.info("%s; the outbox mark stays (%s)", what, describe(exc, "clear"))

    # -- endings -------------------------------------------------------------------------
    def _cleanup(self, exc_text: str) -> None:
        if self.handler is not None and self.ctx is not None:
            try:
                self.handler.on_failure(self.stage, self.ctx, RuntimeError(exc_text))
            except Exception:
                self.log.exception("on_failure hook raised")
        if self.handed_on:  # the next stage's now: never release what a later stage owns
            self.log.info("%s keeps the sandbox: the rollout was handed on", self.stage)
            return
        sandboxes.release(getattr(self.rollout, "sandbox", None))

    def _end(self, status: Status, outcome: Outcome, error: str, **values: Any) -> None:
        self._cleanup(error)
        checkpoints.remove(self.settings, self.rollout_id)  # ended: nothing will restore them
        if terminal.finish(
            self.db,
            self.rollout_id,
            status,
            outcome.value,
            lease=self.lease,
            group=self.job,
            error=error[:4000],
            **{f"{self.stage}_seconds": self._elapsed()},
            **values,
        ):
            self.log.info("%s ends rollout: %s/%s (%s)", self.stage, status.value, outcome.value, error[:200])
        else:
            self.log.warning(
                "%s did not end the rollout as %s/%s: it is no longer this "
                "stage's (handed on, ended or taken over): %s",
                self.stage,
                status.value,
                outcome.value,
                error[:200],
            )

    def _retry_or_fail(self, exc: BaseException, may_resume: bool = True) -> None:
        error = describe(exc, self.stage)
        in_place = may_resume and not isinstance(exc, drain.Drained)  # a drained node is leaving
        if in_place and self.stage in ("run", "eval") and self._resume(error):
            return
        if self.attempt >= self.settings.max_attempts:
            self.log.warning("%s failed on the last attempt: %s", self.stage, error[:200])
            self._end(Status.FAILED, Outcome.INFRA_ERROR, error)
            return
        self.log.warning("%s failed, retrying: %s", self.stage, error[:200])
        self._cleanup(error)
        # turns that could not rebuild this RUN (or whose replay diverged): never replayed again
        note = {} if may_resume else {"replay": False, **divergences(exc)}
        new_attempt = lifecycle.retry(self.db, self.rollout_id, lease=self.lease, error=error, note=note)
        if new_attempt is not None:
            self._deliver("init", new_attempt, None, f"queued attempt {new_attempt}")

    def _resume(self, error: str) -> bool:
        """Queue this RUN again in place when its sandbox is alive, or this EVAL again (see
        `tasks.recovery.resume`)."""
        if self.stage == "eval":
            if not resume.regrade(
                self.settings,
                self.rollout_id,
                self.attempt,
                self.rollout.resumes,
                self.rollout.sandbox,
                error,
                lease=self.lease,
            ):
                return False
            self.handed_on = True  # its grading sandbox is gone; the next EVAL starts its own
            self._deliver("eval", self.attempt, self.settings.node, "queued the EVAL again")
            return True
        if not resume.resumable(
            self.settings, self.job.agent, self.attempt, self.rollout.resumes, self.rollout.sandbox
        ):
            return False
        if resume.requeue(self.settings, self.rollout_id, self.attempt, error, lease=self.lease) is None:
            return False
        self.handed_on = True  # the sandbox is the resumed RUN's
        self._deliver("run", self.attempt, self.settings.node, "queued the RUN again")
        return True


@shared_task(name=TASK_NAMES["init"], bind=True)
def init_stage(self, rollout_id: str, attempt: int, node: str | None = None, job: str | None = None) -> str | None:
    """INIT: claim, start the sandbox, let the handler prepare it."""
    cancelled = self.app.raas_parts.get(CancelMemory)
    if job and attempt == 1 and cancelled.known_cancelled(job):
        return cancelled.drop_stale(self.app, job)  # its rollout was ended at the cancel
    StageRun(self.app, "init", rollout_id, attempt).execute(job)


@shared_task(name=TASK_NAMES["run"], bind=True)
def run_stage(self, rollout_id: str, attempt: int, node: str | None = None, job: str | None = None) -> None:
    """RUN: the multi-turn agent loop on the node that holds the sandbox."""
    StageRun(self.app, "run", rollout_id, attempt).execute()


@shared_task(name=TASK_NAMES["eval"], bind=True)
def eval_stage(self, rollout_id: str, attempt: int, node: str | None = None, job: str | None = None) -> None:
    """EVAL: compute the reward, release the sandbox, record the result."""
    StageRun(self.app, "eval", rollout_id, attempt).execute()
