"""Two real Slurm nodes on one machine, one struck mid-RUN while the other keeps working.

The cluster is `SlurmCluster(nodes=2)`: nodes `n1` and `n2`, each its own slurmd. One node
job per node (`raas slurm write`'s `node.sbatch`, pinned with `-w`), one job of four-turn
`math` rollouts (the simulator's latency keeps both nodes' RUN slots busy), then n2 is struck
once it holds RUN work with stored turns:

- `failure`: n2 loses power: its slurmd, its job's step daemon and every process of its job
  (raas node, pools, sandboxes) SIGKILLed at once, nothing told first. Nothing of raas on n2
  hands anything back: n1's reaper finds n2's rows stale after `RAAS_NODE_TIMEOUT` and gives
  what n2 held a new attempt (replaying its logged turns). Slurm marks n2 DOWN after its
  `SlurmdTimeout` and requeues the job (`--requeue`), which waits for n2 (`-w`).
- `drain`: `scontrol update nodename=n2 state=drain`; the running job keeps running (and
  working) a few seconds, then the site empties the node: `scancel --nodelist=n2` (TERM to
  every process of the job; the node job's trap drains `raas node`, which hands back what it
  cannot finish; its sandboxes got the TERM too).

`TwoNodeReport` adds to `SlurmReport` what n2 held at the strike, how much of it completed on
n1, what n1 completed, and the sandboxes each node left.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

from bench.support.slurm.scenario import SlurmReport, SlurmScenario, sim_stats
from bench.support.waiting import wait_for
from core.db import session_scope
from core.models import Rollout, Turn
from tasks.recovery.nodes import live_queues

SURVIVOR, STRUCK = "n1", "n2"
ROLLOUTS = 24  # distinct problems, one sample each: three waves over two nodes' 4 RUN slots
HOLD_ON_DRAIN = 6  # seconds the drained node's job keeps running before the site cancels it
ENDED = ("CANCELLED", "TIMEOUT", "COMPLETED", "FAILED")


@dataclass
class TwoNodeReport(SlurmReport):
    """What striking n2 cost, and proof n1 did the work."""

    held_by_struck: int = 0  # rollouts on n2 (INIT, RUN, EVAL) when its job died
    struck_with_turns: int = 0  # of which in RUN with 2+ turns stored
    taken_over: int = 0  # of those, completed on n1
    finished_on_struck: int = 0  # of those, completed on n2 (within a drain)
    aborted_generations: int = 0  # LLM answers cut off mid-generation (their client died)
    bad_turn_logs: int = 0  # completed rollouts whose attempt's turns are not 0..k-1 once each
    survivor_completed: int = 0  # completed on n1 with a reward and token arrays
    turns_on_struck_after_drain: int = 0  # turns n2 stored between its drain and its cancel
    leaked_sandboxes: dict[str, int] = field(default_factory=dict)  # node -> sandboxes left
    slurm: str = ""  # what Slurm made of the strike (node and job states)


class TwoNodeScenario:
    """A `SlurmScenario` over a two-node `SlurmCluster`: `run("failure" | "drain")`."""

    def __init__(self, scenario: SlurmScenario) -> None:
        self.s = scenario
        self.cluster = scenario.cluster

    def raas_node(self, job: str) -> str:
        """The `RAAS_NODE` the shipped node job gives itself (first allocation)."""
        return f"{self.cluster.node}-{job}-r0"

    def run(self, fault: str, timeout: float = 300) -> TwoNodeReport:
        """Node jobs on n1 and n2, the rollouts, strike n2 with `fault`, finish on n1, measure."""
        report = TwoNodeReport(fault=fault, layout="shipped", proctrack=self.cluster.proctrack, rollouts=ROLLOUTS)
        self.cluster.wait_nodes_up(90)
        jobs = {n: self.s.submit_node("shipped", f"--nodelist={n}") for n in (SURVIVOR, STRUCK)}
        try:
            self._run(fault, jobs, report, timeout)
        finally:
            self._clean_up(fault, jobs)
        return report

    def _run(self, fault: str, jobs: dict[str, str], report: TwoNodeReport, timeout: float) -> None:
        names = {n: self.raas_node(job) for n, job in jobs.items()}
        wait_for(
            lambda: {f"run.{names[n]}" for n in jobs} <= live_queues(self.s.settings.db_url, 10),
            180,
            "both nodes' RUN pools consuming",
            interval=0.5,
            context=lambda: self.s.job_log(jobs[SURVIVOR]) + self.s.job_log(jobs[STRUCK]) + self.cluster.log_tail(),
        )
        before, started = sim_stats(self.s.sim_url), time.monotonic()
        job_id = self.s.submit(ROLLOUTS).job_id
        wait_for(
            lambda: self._run_with_turns(job_id, names[STRUCK]) >= 2 and self._held(job_id, names[SURVIVOR], "run"),
            120,
            "n2 holding RUN work with stored turns (and n1 working)",
            interval=0.3,
            context=lambda: self.s.job_log(jobs[STRUCK]),
        )
        report.in_run_at_strike = self.s.in_run(job_id)
        held = self._strike(fault, job_id, names[STRUCK], jobs[STRUCK], report)
        if not self.s.wait_terminal(job_id, timeout):
            report.notes.append(f"not terminal after {timeout}s: {self.s.client.job(job_id)}")
            self.s.client.cancel(job_id)
        report.seconds = round(time.monotonic() - started, 1)
        self.s.measure(job_id, report, before, ROLLOUTS, 1)
        report.aborted_generations = sim_stats(self.s.sim_url).get("aborted", 0) - before.get("aborted", 0)
        self._survivor_work(job_id, names[SURVIVOR], held, report)
        report.slurm = "; ".join(filter(None, [report.slurm, self._slurm_after(fault, jobs[STRUCK])]))
        report.leaked_sandboxes = {n: self._leaked(self._scratch(jobs[n])) for n in (SURVIVOR, STRUCK)}
        report.orphans = self._alive_of(jobs[STRUCK])

    def _strike(self, fault: str, job_id: str, node: str, job: str, report: TwoNodeReport) -> set[str]:
        """Fail or drain n2; returns the rollouts it held when its job died."""
        if fault == "failure":
            held, report.struck_with_turns = self._holding(job_id, node)
            report.notes.append(f"{self.cluster.kill_node(STRUCK)} processes of n2 SIGKILLed")
        else:
            self.cluster.run("scontrol", "update", f"nodename={STRUCK}", "state=drain", "reason=raas-test")
            turns = self._turns_on(job_id, node)
            time.sleep(HOLD_ON_DRAIN)  # a drain only stops new jobs: n2's job goes on working
            report.turns_on_struck_after_drain = self._turns_on(job_id, node) - turns
            report.slurm = f"drained: n2 {self.cluster.node_flags(STRUCK)}, job {self.cluster.state(job)}"
            held, report.struck_with_turns = self._holding(job_id, node)
            self.cluster.run("scancel", f"--nodelist={STRUCK}")  # the site empties the node
        report.held_by_struck = len(held)
        return held

    # -- the rows -------------------------------------------------------------------------
    def _held(self, job_id: str, node: str, *statuses: str) -> set[str]:
        """Ids of the job's rollouts on `node` (in `statuses`, default any non-terminal)."""
        wanted = statuses or ("init", "run", "eval")
        return {r.id for r in self.s.rows(job_id) if r.node == node and r.status in wanted}

    def _run_with_turns(self, job_id: str, node: str, turns: int = 2) -> int:
        """Rollouts of the job in RUN on `node` with `turns`+ turns of their attempt stored."""
        stored = (
            sa.select(sa.func.count())
            .select_from(Turn)
            .where(Turn.rollout_id == Rollout.id, Turn.attempt == Rollout.attempt)
            .scalar_subquery()
        )
        with session_scope(self.s.settings.db_url) as db:
            return db.scalar(
                sa.select(sa.func.count())
                .select_from(Rollout)
                .where(Rollout.job_id == job_id, Rollout.node == node, Rollout.status == "run", stored >= turns)
            )

    def _turns_on(self, job_id: str, node: str) -> int:
        """Turns stored so far by the job's rollouts now on `node`."""
        with session_scope(self.s.settings.db_url) as db:
            return db.scalar(
                sa.select(sa.func.count())
                .select_from(Turn)
                .join(Rollout, Turn.rollout_id == Rollout.id)
                .where(Rollout.job_id == job_id, Rollout.node == node, Turn.attempt == Rollout.attempt)
            )

    def _holding(self, job_id: str, node: str) -> tuple[set[str], int]:
        """What `node` holds now: its rollouts, and how many of them are in RUN with turns."""
        return self._held(job_id, node), self._run_with_turns(job_id, node)

    def _survivor_work(self, job_id: str, survivor: str, held: set[str], report: TwoNodeReport) -> None:
        """n1 really worked (rewards, tokens) and really finished what n2 held."""
        for row in self.s.rows(job_id):
            done = row.outcome == "completed" and row.node == survivor
            real = done and row.reward is not None and bool(row.response_ids and row.prompt_ids)
            report.survivor_completed += real
            report.taken_over += real and row.id in held
            report.finished_on_struck += row.outcome == "completed" and row.id in held and row.node != survivor
        with session_scope(self.s.settings.db_url) as db:
            logged = db.execute(
                sa.select(Turn.rollout_id, Turn.index)
                .join(Rollout, Turn.rollout_id == Rollout.id)
                .where(Rollout.job_id == job_id, Rollout.outcome == "completed", Turn.attempt == Rollout.attempt)
            ).all()
        indexes: dict[str, list[int]] = {}
        for rollout_id, index in logged:
            indexes.setdefault(rollout_id, []).append(index)
        report.bad_turn_logs = sum(sorted(i) != list(range(len(i))) for i in indexes.values())

    # -- the node's leftovers -------------------------------------------------------------
    def _alive_of(self, job: str) -> int:
        """Processes of n2's node job still alive (its job ended or its node died)."""
        tag = f"RAAS_NODE={self.raas_node(job)}".encode()
        count = 0
        for pid in self.s.our_pids():
            try:
                count += tag in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
        return count

    def _scratch(self, job: str) -> Path | None:
        """The node job's scratch folder, as its log names it."""
        found = re.search(r"scratch (\S+)", self.s.job_log(job))
        return Path(found.group(1)) if found else None

    def _leaked(self, scratch: Path | None) -> int:
        """Sandboxes of the node still alive that no rollout holds: live bwraps under its
        scratch, but for the live pool's unclaimed warm members (its pool, not a leak). The
        node's reaper gets a few passes to clean up first."""
        if scratch is None:
            return 0

        def left() -> list[int]:
            warm = _warm_paths(scratch / "sbx")
            out = subprocess.run(["pgrep", "-a", "bwrap"], capture_output=True, text=True).stdout
            return [
                int(line.split()[0])
                for line in out.splitlines()
                if str(scratch) in line and not any(w in line for w in warm)
            ]

        try:
            wait_for(lambda: not left(), 10, "no sandboxes left", interval=0.5)
        except AssertionError:
            pass
        return len(left())

    # -- Slurm's side ---------------------------------------------------------------------
    def _slurm_after(self, fault: str, job: str) -> str:
        """How Slurm saw the struck node and its job once the work was done."""
        if fault == "failure":  # a silent slurmd is DOWN after SlurmdTimeout; the job requeued
            limit = self.cluster.slurmd_timeout + 60
            try:
                wait_for(lambda: "DOWN" in self.cluster.node_flags(STRUCK), limit, "n2 DOWN", interval=1)
            except AssertionError:
                pass
        else:  # CANCELLED at once; its processes drain, then Slurm kills the rest (KillWait)
            self.cluster.wait_state(job, ENDED, 90)
            wait_for(
                lambda: not self.cluster.run("squeue", "-h", "-j", job, check=False).stdout.strip(),
                self.cluster.kill_wait + 60,
                "n2's job to finish completing",
                interval=0.5,
            )
            time.sleep(5)  # what outlives the job shows now (the one-node tier's 5 s)
        info = self.cluster.job_info(job)
        return (
            f"ended: n2 {self.cluster.node_flags(STRUCK)}, job {info.get('JobState')} "
            f"(reason {info.get('Reason')}, restarts {info.get('Restarts')})"
        )

    def _clean_up(self, fault: str, jobs: dict[str, str]) -> None:
        """Both node jobs gone, n2 back in service with no leftover of its job."""
        scratch = self._scratch(jobs[STRUCK])
        self.s.stop_nodes()
        if fault == "failure":
            self.cluster.restart_node(STRUCK, timeout=90)
        else:
            self.cluster.run("scontrol", "update", f"nodename={STRUCK}", "state=resume", check=False)
        if scratch is not None:  # a killed node never removed its scratch (a reboot would)
            shutil.rmtree(scratch, ignore_errors=True)


def _warm_paths(sandbox_dir: Path) -> list[str]:
    """Paths of the live pool's unclaimed warm sandboxes (their workspace, socket folder)."""
    from sandbox.handles import orphaned, read_handles, unclaimed

    if not sandbox_dir.exists():
        return []
    paths = []
    for handle in read_handles(sandbox_dir):
        if unclaimed(handle) and not orphaned(handle):
            paths += [str(handle[k]) for k in ("workspace", "socket_dir") if handle.get(k)]
    return paths
