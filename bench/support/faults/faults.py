"""The faults of issue 15's campaign, each a `Fault` that `Campaign.run` strikes mid-job.

A fault's `strike(campaign, job, report)` waits until the job is where the fault hurts (e.g.
rollouts mid-RUN with turns stored), injects it, records which rollouts it hit on the report,
and returns; `after` runs once the job has ended (a lost node returning). Restarting a killed
pool at once is what a supervisor (systemd, Slurm, `raas up`) does, not a human step.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa

from core.db import session_scope
from core.models import Rollout, Turn
from bench.support.faults.campaign import CONCURRENCY, NODES, Campaign, Report
from bench.support.pipeline_harness import wait_for
from raas_client.models import JobAccepted

Strike = Callable[[Campaign, JobAccepted, Report], None]
OUTAGE_SECONDS = 3.0  # the goal: a 3 s Redis or PostgreSQL restart costs 0 re-runs


@dataclass(frozen=True)
class Fault:
    """One fault of the campaign and what its job may end with."""

    name: str
    strike: Strike
    after: Callable[[Campaign, Report], None] | None = None
    rollouts: int = 12
    outcomes: tuple[str, ...] = ("completed",)
    aof: bool = False  # the broker keeps an append-only file during this job
    supervised: bool = True  # False: a pool that exits stays dead (the README's node layout
    # before `raas node`: `raas worker ... &` per stage, nothing restarts them)
    timeout: float = 90  # seconds the job may take to end
    slow_tools: bool = False  # the job's tool calls take a while (`campaign.SLOW_TOOLS`)
    registered_pool: bool = False  # the job uses the registered server pool (its hot path:
    # the generation mark, claim, take and release are driver statements), not named servers


def _node_of(row: Rollout) -> str | None:
    return row.node or (row.lease_owner or "").split("/")[0] or None


def _leased(c: Campaign, job_id: str, stage: str, min_turns: int = 0) -> list[Rollout]:
    """Rollouts of the job a `stage` worker holds now (with at least `min_turns` stored)."""
    with session_scope(c.db) as s:
        turns = (
            sa.select(sa.func.count())
            .select_from(Turn)
            .where(Turn.rollout_id == Rollout.id, Turn.attempt == Rollout.attempt)
            .scalar_subquery()
        )
        rows = s.scalars(
            sa.select(Rollout).where(
                Rollout.job_id == job_id, Rollout.status == stage, Rollout.lease_owner.is_not(None), turns >= min_turns
            )
        ).all()
        s.expunge_all()
        return list(rows)


def _unfinished(c: Campaign, job_id: str) -> set[str]:
    return {r.id for r in c.rows(job_id) if r.finished_at is None}


def _mid_run(c: Campaign, job_id: str) -> list[Rollout]:
    """Wait until some rollouts are mid-RUN with turns stored (where a fault costs most)."""
    return wait_for(
        lambda: _leased(c, job_id, "run", min_turns=1),
        timeout=60,
        what="a rollout mid-RUN with a stored turn",
        interval=0.05,
    )


# -- worker kills -------------------------------------------------------------------------
def sigkill_every_stage(c: Campaign, job: JobAccepted, report: Report) -> None:
    """SIGKILL an INIT, a RUN and an EVAL pool while each holds work; restart each at once."""
    rng = random.Random(15)
    # RUN is killed once a rollout has 2 turns stored: a restart from INIT re-generates them,
    # a resume in the same sandbox at most the turn that was in flight.
    for stage, turns in (("init", 0), ("run", 2), ("eval", 0)):
        rows = wait_for(
            lambda stage=stage, turns=turns: _leased(c, job.job_id, stage, turns),
            timeout=60,
            what=f"a rollout held by {stage}",
            interval=0.05,
        )
        node = rng.choice(sorted({_node_of(r) for r in rows}))
        hit = {r.id for r in rows if _node_of(r) == node}
        c.restart_pool(stage, node)
        if stage == "run":  # the rollouts with finished turns it had in hand
            report.affected_ids |= hit
            report.affected = len(report.affected_ids)
        report.notes.append(f"SIGKILL {stage}.{node} holding {len(hit)}")


# -- node loss ------------------------------------------------------------------------------
def lose_node(c: Campaign, job: JobAccepted, report: Report) -> None:
    """n1's pools and reaper die for good, holding leased RUN work and RUN work queued for it.

    Its RUN pool dies first, with rollouts mid-RUN (one with 2 turns stored at least: a
    restart from INIT generates them again, a replay in a rebuilt sandbox at most the turn in
    flight); its INIT pool goes on handing rollouts to `run.n1` until one waits there; then the
    rest of the node and its reaper die.
    """
    lost = NODES[0]
    wait_for(
        lambda: [r for r in _leased(c, job.job_id, "run", 2) if _node_of(r) == lost],
        timeout=60,
        what=f"a rollout mid-RUN on {lost}",
        interval=0.05,
    )
    c.lose_node(lost, stages=("run",), reaper=False)

    def queued_for_lost_node() -> bool:
        return any(r.node == lost and r.status == "run" and not r.lease_owner for r in c.rows(job.job_id))

    wait_for(queued_for_lost_node, timeout=60, what=f"a rollout queued for run.{lost}", interval=0.05)
    c.lose_node(lost)
    report.affected_ids = {r.id for r in c.rows(job.job_id) if r.node == lost and r.finished_at is None}
    report.affected = len(report.affected_ids)
    report.notes.append(f"{lost} lost holding {report.affected} rollouts")


def node_returns(c: Campaign, report: Report) -> None:
    """The lost node comes back after the job ended: it must stop its stale sandboxes."""
    c.heal()


# -- broker and database restarts ---------------------------------------------------------
def redis_restart(c: Campaign, job: JobAccepted, report: Report) -> None:
    """Redis restarts (down 3 s) mid-RUN; a second job is submitted during the outage."""
    _mid_run(c, job.job_id)
    report.affected_ids = _unfinished(c, job.job_id)
    report.affected = len(report.affected_ids)
    restart = c.redis.restart_in_background("fast", OUTAGE_SECONDS)
    time.sleep(1.0)
    report.extra_jobs.append(c.submit(2, offset=report.rollouts))
    report.rollouts += 2
    restart.join(60)


def redis_restart_during_acks(c: Campaign, job: JobAccepted, report: Report) -> None:
    """Issue 26: Redis restarts with nothing persisted (down 3 s) while RUN leases are held
    and stages finish and ack, and n2's EVAL consumer fails once at the same moment (as the
    ack through kombu's cleared connection made it fail); nothing restarts a pool that exits."""
    _mid_run(c, job.job_id)
    try:  # strike with several RUN leases held when the machine lets INIT keep up
        wait_for(
            lambda: len(_leased(c, job.job_id, "run", min_turns=1)) >= 4,
            timeout=10,
            what="4 rollouts mid-RUN",
            interval=0.05,
        )
    except AssertionError:
        pass
    held = len(_leased(c, job.job_id, "run"))
    c.eval_log_mark = len(_eval_log(c))  # type: ignore[attr-defined]
    report.affected_ids = _unfinished(c, job.job_id)
    report.affected = len(report.affected_ids)
    restart = c.redis.restart_in_background("fast", OUTAGE_SECONDS)
    c.fail_consumer_once("eval", NODES[1])
    restart.join(60)
    report.notes.append(f"Redis restarted with {held} RUN leases held, {report.affected} rollouts unfinished")


def drain_node(c: Campaign, job: JobAccepted, report: Report) -> None:
    """Issue 27: a node's pools get SIGTERM (2 s drain) while it holds RUNs with stored turns,
    as at the end of its Slurm job; the node does not come back during the job. `affected`:
    rollouts that had not finished RUN there then (the most that may restart from INIT), and
    any its INIT pool took just before the signal and handed back."""
    mid_run = _mid_run(c, job.job_id)
    drained = sorted({_node_of(r) for r in mid_run})[0]  # a node holding RUNs with turns
    before_run = {r.id for r in c.rows(job.job_id) if r.node == drained and r.status in ("init", "run")}
    seconds, codes = c.drain_node(drained)
    # and one the node's INIT took between that look and the signal, handed back by the drain
    handed_back = {
        r.id
        for r in c.rows(job.job_id)
        if any(f"node {drained} drains" in str(h.get("error")) for h in r.attempt_history or [])
    }
    report.affected_ids = before_run | handed_back
    report.affected = len(report.affected_ids)
    report.notes.append(f"{drained} drained in {seconds}s, exit codes {codes}")


def _eval_log(c: Campaign) -> str:
    path = c.svc.logs / f"eval-{NODES[1]}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def consumer_failure_seen(c: Campaign, report: Report) -> None:
    """Say in the report how n2's EVAL pool took its forced consumer failure (this job's
    part of its log: the failure's traceback, and what the pool did)."""
    log = _eval_log(c)[getattr(c, "eval_log_mark", 0) :]
    report.notes.append(
        f"eval.{NODES[1]} consumer: failed {log.count(', in _crash')}x, "
        f"restarted in-process {log.count('restarting it in this process')}x,"
        f" unrecoverable {log.count('Unrecoverable error')}x"
    )


def postgres_restart(mode: str) -> Strike:
    """PostgreSQL stops with `mode` and is back after 3 s, struck where it hurts (issue 40):
    while every RUN slot the machine lets fill holds a rollout between turns (turns stored,
    more to come) whose tool calls take 0.8 s, so each RUN meets the outage in its per-turn
    statements (the generation mark, the server claim, the turn insert) or its hand-off; with
    fast tools a RUN met it in the turn insert's settle, whose SQLAlchemy path always retried."""

    def strike(c: Campaign, job: JobAccepted, report: Report) -> None:
        _mid_run(c, job.job_id)
        slots = CONCURRENCY["run"] * len(NODES)
        try:
            wait_for(
                lambda: len(_leased(c, job.job_id, "run", min_turns=1)) >= slots - 1,
                timeout=10,
                what=f"{slots - 1} rollouts mid-RUN",
                interval=0.05,
            )
        except AssertionError:
            pass
        held = len(_leased(c, job.job_id, "run", min_turns=1))
        report.affected_ids = _unfinished(c, job.job_id)
        report.affected = len(report.affected_ids)
        c.pg.restart(mode, OUTAGE_SECONDS)  # type: ignore[arg-type]
        report.notes.append(f"PostgreSQL down {OUTAGE_SECONDS:.0f}s with {held} RUN leases between turns")

    return strike


# -- cancel -------------------------------------------------------------------------------
def cancel_mid_run(c: Campaign, job: JobAccepted, report: Report) -> None:
    """The trainer cancels the job while rollouts are mid-RUN and others still queue."""
    _mid_run(c, job.job_id)
    report.affected_ids = _unfinished(c, job.job_id)
    report.affected = len(report.affected_ids)
    c.svc.client.cancel(job.job_id)


FAULTS = {
    f.name: f
    for f in [
        Fault("sigkill-every-stage", sigkill_every_stage, rollouts=16),
        Fault("redis-restart", redis_restart),
        Fault("redis-restart-aof", redis_restart, aof=True),
        Fault("postgres-restart-fast", postgres_restart("fast"), rollouts=18, slow_tools=True, registered_pool=True),
        Fault(
            "postgres-restart-immediate",
            postgres_restart("immediate"),
            rollouts=18,
            slow_tools=True,
            registered_pool=True,
        ),
        Fault("cancel-mid-run", cancel_mid_run, outcomes=("cancelled", "completed")),
        Fault("node-loss", lose_node, after=node_returns, rollouts=16),
        Fault("node-drain", drain_node, after=node_returns, rollouts=16),
        Fault(
            "redis-restart-during-acks",
            redis_restart_during_acks,
            rollouts=24,
            after=consumer_failure_seen,
            supervised=False,
            timeout=180,
        ),
    ]
}
