"""Partition schedules (issue 42): a node that stays alive while a link of its is cut, slow or
lossy. Each is a campaign `Fault` (bench/support/faults/faults.py) run on a `Campaign(links=True)`:
node n1 reaches PostgreSQL and Redis, and the gateway Redis, through loopback proxies the test
made (`bench.support.tcp_proxy`); node n2 through its own, left alone. A schedule strikes while
rollouts are mid-RUN, lets the job go on, and heals; the job must end exactly as scripted
(`Campaign._measure`) with a clean history (`bench.support.partitions.checker`).

The lease is 6 s (`campaign.RELIABILITY`) and a stage retries the database for as long; a cut
of 20 s outlasts both, so n2's reaper takes n1's RUNs over while n1's statements wait in the
proxy, and they arrive after the heal.
"""

from __future__ import annotations

import time
from typing import Any

from bench.support.faults.campaign import PROBLEMS, Campaign, Report
from bench.support.faults.faults import Fault, _mid_run, _unfinished
from bench.support.partitions.checker import check_history
from bench.support.pipeline_harness import wait_for
from bench.support.tcp_proxy import Direction
from raas_client.models import JobAccepted, JobView

CUT = "n1"  # the node whose links the schedules cut
TRIVIAL_BURST = 1000  # rollouts the gateway accepts while its Redis link is cut


def warm_up(c: Campaign) -> None:
    """One job before the schedules, on the registered pool: the gateway's first submission
    loads what submissions need (templates, the tokenizer) and on a loaded machine took longer
    than the client's 60 s; each schedule's job then meets only its own fault."""
    c.svc.wait_done(c.submit(2, offset=len(PROBLEMS) - 2, registered=True).job_id, timeout=300)


def _mark(c: Campaign, job: JobAccepted, report: Report) -> None:
    report.resets_before = sum(link.resets for link in c.links.values())  # type: ignore[attr-defined]
    _mid_run(c, job.job_id)
    report.affected_ids = {r.id for r in c.rows(job.job_id) if r.node == CUT and r.finished_at is None}
    report.affected = len(report.affected_ids) or len(_unfinished(c, job.job_id))


def cut(service: str, seconds: float, direction: Direction = "both") -> Any:
    """n1's link to `service` ("pg" or "redis") partitioned for `seconds` mid-RUN, then healed
    (bytes held in `direction` are delivered late)."""

    def strike(c: Campaign, job: JobAccepted, report: Report) -> None:
        _mark(c, job, report)
        c.links[CUT, service].partition(direction)
        time.sleep(seconds)
        c.links[CUT, service].heal()
        report.notes.append(f"{CUT}<->{service} cut ({direction}) {seconds:.0f}s mid-RUN")

    return strike


def degrade(delay: float = 0.0, reset_rate: float = 0.0, services: tuple[str, ...] = ("pg", "redis")) -> Any:
    """n1's links slowed by `delay` per chunk each way and/or resetting connections with
    `reset_rate` per chunk, for the rest of the job (the `after` hook restores them)."""

    def strike(c: Campaign, job: JobAccepted, report: Report) -> None:
        for service in services:
            c.links[CUT, service].delay = delay
            c.links[CUT, service].reset_rate = reset_rate
        _mark(c, job, report)
        report.notes.append(f"{CUT} links {services}: +{delay * 2:.1f}s per round trip, resets {reset_rate}/chunk")

    return strike


def flap(service: str, cycles: int, down: float, up: float) -> Any:
    """n1's link to `service` down `down` s, up `up` s, `cycles` times (a flapping link)."""

    def strike(c: Campaign, job: JobAccepted, report: Report) -> None:
        _mark(c, job, report)
        for _ in range(cycles):
            c.links[CUT, service].partition()
            time.sleep(down)
            c.links[CUT, service].heal()
            time.sleep(up)
        report.notes.append(f"{CUT}<->{service} flapped {cycles}x ({down}s down, {up}s up)")

    return strike


def gateway_cut_during_submit(seconds: float) -> Any:
    """The gateway's Redis link cut while a trainer submits a burst of trivial rollouts: each
    submission must be answered (the outbox holds the messages) and every rollout run once
    after the heal."""

    def strike(c: Campaign, job: JobAccepted, report: Report) -> None:
        _mark(c, job, report)
        c.links["gateway", "redis"].partition()
        started = time.monotonic()
        instances = [{"instance_id": f"burst-{k}", "data": {}} for k in range(TRIVIAL_BURST)]
        burst = c.svc.client.submit("test-trivial", instances)
        report.notes.append(f"burst of {TRIVIAL_BURST} answered in {time.monotonic() - started:.1f}s while cut")
        report.side_jobs.append(burst)
        time.sleep(max(0.0, seconds - (time.monotonic() - started)))
        c.links["gateway", "redis"].heal()

    return strike


def check(c: Campaign, report: Report) -> None:
    """Restore every link, wait for the side jobs, then judge every job's history
    (`bench.support.partitions.checker`)."""
    for link in c.links.values():
        link.heal()
        link.delay = link.reset_rate = 0.0
    for side in report.side_jobs:
        _judge_side_job(c, side, report)
    for job_id in report.job_ids:
        check_history(c, job_id, report)
    resets = sum(link.resets for link in c.links.values()) - getattr(report, "resets_before", 0)
    if resets:
        report.notes.append(f"connections reset by the links: {resets}")


def _judge_side_job(c: Campaign, job: JobAccepted, report: Report) -> None:
    """A trivial burst: every rollout completed, each result once."""
    try:
        wait_for(lambda: _ended(c, job), timeout=180, what="the burst's rollouts", interval=0.5)
    except AssertionError as exc:
        report.notes.append(str(exc).splitlines()[0][:300])
    view = c.svc.client.job(job.job_id)
    report.rollouts += view.n_rollouts
    report.finished += view.finished
    report.lost += view.n_rollouts - view.finished
    completed = (view.outcomes or {}).get("completed", 0)
    report.unexpected_outcomes += view.finished - completed
    ids = [r.rollout_id for r in c._results(job.job_id)]
    report.duplicated += len(ids) - len(set(ids))
    report.notes.append(f"burst: {completed}/{view.n_rollouts} completed, {len(ids)} results")


def _ended(c: Campaign, job: JobAccepted) -> JobView | None:
    view = c.svc.client.job(job.job_id)
    return view if view.finished >= view.n_rollouts else None


SCHEDULES = {
    f.name: f
    for f in [
        Fault("n1-pg-cut-20s", cut("pg", 20), after=check, rollouts=12, timeout=150, registered_pool=True),
        Fault("n1-redis-cut-20s", cut("redis", 20), after=check, rollouts=12, timeout=150),
        Fault("n1-pg-cut-up-only-20s", cut("pg", 20, "up"), after=check, rollouts=12, timeout=150),
        Fault("n1-pg-cut-down-only-20s", cut("pg", 20, "down"), after=check, rollouts=12, timeout=150),
        Fault("n1-pg-flapping", flap("pg", cycles=4, down=4, up=2), after=check, rollouts=12, timeout=150),
        Fault("n1-links-300ms", degrade(delay=0.15), after=check, rollouts=12, timeout=240),
        Fault("n1-pg-resets", degrade(reset_rate=0.01, services=("pg",)), after=check, rollouts=12, timeout=240),
        Fault("gateway-redis-cut-burst", gateway_cut_during_submit(15), after=check, rollouts=8, timeout=240),
    ]
}
