"""raas node jobs under a real Slurm, and what a scancel, a time limit or a requeue costs.

One `SlurmScenario` is a gateway (in this process, over real HTTP), the shared Redis and
PostgreSQL (a fresh database and key prefix), the LLM simulator (a fake of vLLM, named as
such) answering `math` rollouts in four turns, one problem in four wrongly on purpose (so a
right reward proves real work), and a private Slurm cluster (`cluster.SlurmCluster`) that
runs the node jobs in real bwrap sandboxes.

`run(fault, layout)` submits a job, starts node job A, strikes A mid-RUN with `fault`
(`scancel`, `timelimit`, `requeue`), starts node job B where the fault leaves no node
(a requeued A comes back by itself), waits until every rollout is terminal and returns a
`SlurmReport`. `layout` is `shipped` (`raas slurm write`'s node job) or `readme` (the
README's layout before issue 27: a worker per stage and a reaper as `&` children of the
batch script, `--signal=TERM@90`: the "before" of the closing note).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from werkzeug.serving import make_server

from app import create_app
from app.ops.slurm import SlurmJobConfig, write_jobs
from raas_client import RaasClient
from app.recovery_costs import job_cost
from core.db import session_scope
from core.models import Rollout, Turn
from core.settings import Settings
from migrations.runner import upgrade
from bench.support.faults.campaign import PROBLEMS, SMOLLM2, TURNS, answers_right, script
from bench.support.slurm.cluster import SlurmCluster
from raas_client.models import JobAccepted, RolloutView

SLOTS = {"init": 2, "run": 4, "eval": 2}
STRUCK_WITH_TURNS = 3  # rollouts in RUN with 2+ turns stored when a scancel or requeue strikes
DRAIN = 10  # RAAS_SOFT_SHUTDOWN_TIMEOUT of the node jobs
LATENCY = 1.0  # seconds per LLM answer: a rollout's RUN takes ~4 s, a fault lands in it
RELIABILITY = {
    "RAAS_HEARTBEAT_INTERVAL": "0.5",
    "RAAS_LEASE_TIMEOUT": "6",
    "RAAS_REQUEUE_AFTER": "3",
    "RAAS_REAPER_INTERVAL": "0.5",
    "RAAS_NODE_TIMEOUT": "12",
    "RAAS_MAX_ATTEMPTS": "4",
    "RAAS_OUTBOX_GRACE": "5",
    "RAAS_STAGE_GRACE": "2",
}
MARK = "RAASTEST_SLURM_MARK"  # in every process of our node jobs: orphans are found by it
# (problems, samples each). The time limit is set on A once its RUN slots are busy (the
# next whole minute of its run time): the controller checks limits every 30 s and may send
# `--signal` up to 60 s early, so the limit strikes 0-30 s (B:TERM) or 30-90 s (the kill)
# later; its job keeps A alone busy that long (4 RUN slots, ~4 s a rollout: 108 rollouts are
# ~110 s of RUN; 81 ran out before a late strike once forked groups made INIT fast).
# `drain` is `scancel -b -s TERM`: the batch shell alone, what a user does to stop a node
# gracefully (bench only).
ROLLOUTS = {"scancel": (16, 1), "timelimit": (27, 4), "requeue": (16, 1), "drain": (16, 1)}

README_NODE_JOB = r"""#!/bin/bash
#SBATCH --job-name=raas-node-readme
#SBATCH --signal=TERM@90
#SBATCH --requeue
#SBATCH --cpus-per-task=8
#SBATCH --mem=8G
#SBATCH --open-mode=append
# The README's cluster section before issue 27: `export RAAS_*` on the node, a worker per
# stage and a reaper as children of the batch script. (RAAS_NODE is made unique per job:
# on a real cluster the next job lands on another host.)
source {env}
export RAAS_HOME={home}   # the README's default: .raas in the (shared) submit folder
export RAAS_NODE=$(hostname -s)-$SLURM_JOB_ID
raas worker --stage init --concurrency {init}  &
raas worker --stage run  --concurrency {run} &
raas worker --stage eval --concurrency {eval}  &
raas reaper &
wait
"""


@dataclass
class SlurmReport:
    """What one struck node job cost. `lost`, `duplicated`, `wrong_rewards`,
    `not_completed` must be 0; `rerun_from_init` is the waste the drain keeps small."""

    fault: str
    layout: str
    proctrack: str
    rollouts: int
    seconds: float = 0.0
    completed: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    lost: int = 0  # rollouts never terminal
    not_completed: int = 0  # terminal without `completed` (agent_error, infra_error)
    duplicated: int = 0  # results beyond one per rollout
    wrong_rewards: int = 0  # completed with a reward other than the scripted one
    agent_errors: int = 0  # of which agent_error (the trainer would learn from it)
    missing_tokens: int = 0
    in_run_at_strike: int = 0  # rollouts in RUN (running or queued for it) at the strike
    rerun_from_init: int = 0  # rollouts that ended on an attempt > 1 (INIT ran again)
    loops_regenerated: int = 0  # agent loops begun again (a first turn generated again)
    turns_regenerated: int = 0  # answered turns beyond one per sample (issue 41: finished work redone)
    turns_regenerated_max: int = 0  # the most of them for one problem, per sample (goal <= 1)
    replayed_turns: int = 0  # logged turns replayed into rebuilt sandboxes (metrics.replayed_turns)
    tokens_regenerated: int = (
        0  # tokens of logged turns generated again, as the service counts them (app.recovery_costs)
    )
    orphans: int = 0  # processes of the struck job alive 5 s after it ended
    notes: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        """Why the job was not clean."""
        names = ("lost", "not_completed", "duplicated", "wrong_rewards", "missing_tokens")
        return [f"{n}={getattr(self, n)}" for n in names if getattr(self, n)]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready figures."""
        return asdict(self)


class SlurmScenario:
    """The service around a private Slurm cluster (module doc)."""

    def __init__(
        self,
        home: Path,
        cluster: SlurmCluster,
        db_url: str,
        redis_url: str,
        env_root: Path,
        pythonpath: str | None = None,
    ) -> None:
        self.home, self.cluster, self.env_root = home, cluster, env_root
        self.mark = uuid.uuid4().hex[:12]
        self.redis_url = redis_url
        self.prefix = prefix = f"raas-slurm-{self.mark}:"
        self.settings = Settings(
            home=home / "gateway",
            database_url=db_url,
            broker_url=redis_url,
            broker_key_prefix=prefix,
            heartbeat_interval=0.5,
            lease_timeout=6.0,
            outbox_grace=5.0,
        )
        upgrade(self.settings.db_url)
        app = create_app(self.settings)
        self._server = make_server("127.0.0.1", 0, app, threaded=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self.client = RaasClient(self.url, timeout=60)
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        from fakellm.server import start_simulator

        self.sim_url, self._stop_sim = start_simulator(SMOLLM2, {**script(), "latency": LATENCY})
        self.llm = {"servers": [{"url": self.sim_url}], "tokenizer": SMOLLM2, "max_model_len": 4096}
        environ = {
            "RAAS_DATABASE_URL": db_url,
            "RAAS_BROKER_URL": redis_url,
            "RAAS_BROKER_KEY_PREFIX": prefix,
            "RAAS_SANDBOX_RUNTIME": "bwrap",
            **RELIABILITY,
        }
        self.jobs_dir = home / "slurm"
        cfg = SlurmJobConfig(
            **SLOTS, drain=DRAIN, signal_margin=20, mem_per_sandbox_mb=256, env_root=env_root, time="10:00"
        )
        write_jobs(cfg, self.jobs_dir, environ)
        extra = [f"export {MARK}={self.mark}"]
        if pythonpath:  # the "before" tree: main's code instead of this checkout
            extra.append(f"export PYTHONPATH={shlex.quote(pythonpath)}")
        with open(self.jobs_dir / "raas.env", "a") as env:
            env.write("\n".join(extra) + "\n")
        readme_home = home / "submit-dir" / ".raas"
        (readme_home / "envs").mkdir(parents=True)
        (readme_home / "envs" / "math").symlink_to((env_root / "math").resolve())
        (self.jobs_dir / "readme.sbatch").write_text(
            README_NODE_JOB.format(env=self.jobs_dir / "raas.env", home=readme_home, **SLOTS)
        )
        self.job_ids: list[str] = []
        # `python -m` puts the job's working directory first on sys.path: the "before" tree's
        # node jobs start in it, or they would import the submitter's checkout
        self.chdir = (f"--chdir={pythonpath}",) if pythonpath else ()

    # -- node jobs ------------------------------------------------------------------------
    def submit_node(self, layout: str, *options: str) -> str:
        """sbatch the node job of `layout` (SBATCH_EXPORT=NONE, as strict sites set it)."""
        script = self.jobs_dir / ("node.sbatch" if layout == "shipped" else "readme.sbatch")
        out = f"--output={self.jobs_dir}/logs/{layout}-%j.out"
        job = self.cluster.sbatch(script, out, *self.chdir, *options, env={"SBATCH_EXPORT": "NONE"})
        self.job_ids.append(job)
        return job

    def job_log(self, job: str) -> str:
        """The node job's output so far."""
        return "\n".join(p.read_text(errors="replace") for p in (self.jobs_dir / "logs").glob(f"*-{job}*.out"))

    def our_pids(self) -> list[int]:
        """Processes carrying this scenario's mark (what our node jobs started)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if f"{MARK}={self.mark}".encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

    def kill_orphans(self) -> int:
        """SIGKILL what our node jobs left behind (proctrack/linuxproc lets it escape)."""
        pids = self.our_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    # -- the rollouts ---------------------------------------------------------------------
    def rows(self, job_id: str) -> list[Rollout]:
        """The job's rollout rows."""
        with session_scope(self.settings.db_url) as s:
            rows = s.scalars(sa.select(Rollout).where(Rollout.job_id == job_id)).all()
            s.expunge_all()
            return list(rows)

    def in_run(self, job_id: str) -> int:
        """Rollouts of the job in RUN now."""
        return sum(r.status == "run" for r in self.rows(job_id))

    def with_turns(self, job_id: str, turns: int) -> int:
        """Rollouts of the job in RUN with at least `turns` turns of their attempt stored."""
        with session_scope(self.settings.db_url) as s:
            stored = (
                sa.select(sa.func.count())
                .select_from(Turn)
                .where(Turn.rollout_id == Rollout.id, Turn.attempt == Rollout.attempt)
                .scalar_subquery()
            )
            return s.scalar(
                sa.select(sa.func.count())
                .select_from(Rollout)
                .where(Rollout.job_id == job_id, Rollout.status == "run", stored >= turns)
            )

    def submit(self, n: int, samples: int = 1, client: RaasClient | None = None) -> JobAccepted:
        """A job of `n` distinct problems, `samples` rollouts each."""
        instances = [
            {"instance_id": p["instance_id"], "data": {"problem": p["problem"], "answer": p["answer"]}}
            for p in PROBLEMS[:n]
        ]
        return (client or self.client).submit(
            "math", instances, n_samples=samples, llm=self.llm, limits={"max_turns": TURNS + 2}
        )

    def wait_terminal(self, job_id: str, timeout: float) -> bool:
        """Wait until every rollout of the job is terminal."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            view = self.client.job(job_id)
            if view.finished >= view.n_rollouts:
                return True
            time.sleep(0.5)
        return False

    # -- one struck node job --------------------------------------------------------------
    def run(self, fault: str, layout: str, timeout: float = 420) -> SlurmReport:
        """Submit, strike node job A mid-RUN with `fault`, finish on B, measure."""
        n, samples = ROLLOUTS[fault]
        report = SlurmReport(fault=fault, layout=layout, proctrack=self.cluster.proctrack, rollouts=n * samples)
        before = sim_stats(self.sim_url)
        started = time.monotonic()
        try:
            job_id, a = self._strike_and_finish(fault, layout, n, samples, timeout, report)
            report.seconds = round(time.monotonic() - started, 1)
            report.orphans = self._orphans_of(a, fault)
            self.measure(job_id, report, before, n, samples)
        finally:
            self.stop_nodes()  # the next fault starts with no node, whatever happened
        return report

    def _strike_and_finish(
        self, fault: str, layout: str, n: int, samples: int, timeout: float, report: SlurmReport
    ) -> tuple[str, str]:
        a = self.submit_node(layout)
        self.cluster.wait_state(a, ("RUNNING",), 60)
        job_id = self.submit(n, samples).job_id
        _wait(lambda: self.in_run(job_id) >= SLOTS["run"], 90, "node job A's RUN slots busy", lambda: self.job_log(a))
        # several turns into their loops: what a restart from INIT would generate again
        try:
            _wait(lambda: self.with_turns(job_id, 2) >= STRUCK_WITH_TURNS, 60, "rollouts with 2 turns stored")
        except AssertionError:
            report.notes.append(f"struck with {self.with_turns(job_id, 2)} rollouts holding 2+ turns")
        report.in_run_at_strike = self._strike(fault, a, job_id)
        if fault != "requeue":
            self.submit_node(layout)  # the rest of the cluster: another node job
        if not self.wait_terminal(job_id, timeout):
            report.notes.append(f"not terminal after {timeout}s: {self.client.job(job_id)}")
            self.client.cancel(job_id)  # measured as lost; it must not feed the next case
        return job_id, a

    def stop_nodes(self) -> None:
        """Cancel every node job of this scenario, wait for them to end, kill orphans."""
        for job in self.job_ids:
            self.cluster.run("scancel", job, check=False)
        for job in self.job_ids:
            try:
                self.cluster.wait_state(job, ("CANCELLED", "TIMEOUT", "COMPLETED", "FAILED", "UNKNOWN"), 90)
            except AssertionError:
                pass
        self.kill_orphans()

    def _strike(self, fault: str, a: str, job_id: str) -> int:
        if fault == "timelimit":  # the controller signals B:TERM (or TERM@90), then kills
            run_time = self.cluster.job_info(a).get("RunTime", "0:0:0")
            seconds = sum(int(x) * 60**i for i, x in enumerate(reversed(run_time.split("-")[-1].split(":"))))
            self.cluster.run("scontrol", "update", f"JobId={a}", f"TimeLimit={seconds // 60 + 1}")
            # The count polled last before the signal is the one at the strike: read after
            # it, the drain may already have handed the RUN rollouts back.
            last = [0]

            def struck() -> bool:
                if self.cluster.state(a) != "RUNNING" or "TERM at" in self.job_log(a):
                    return True
                last[0] = self.in_run(job_id)
                return False

            _wait(struck, 150, "the time limit's signal", lambda: self.job_log(a))
            return max(last[0], self.in_run(job_id))
        in_run = self.in_run(job_id)
        if fault == "scancel":
            self.cluster.run("scancel", a)
        elif fault == "drain":
            self.cluster.run("scancel", "-b", "-s", "TERM", a)
        else:
            self.cluster.run("scontrol", "requeue", a)
            # Slurm holds a requeued job ~120 s (BeginTime); a test need not wait for it.
            self.cluster.wait_state(a, ("PENDING",), 90)
            self.cluster.run("scontrol", "update", f"JobId={a}", "StartTime=now")
        return in_run

    def _orphans_of(self, a: str, fault: str) -> int:
        """Our processes alive once A's first allocation ended (a requeued A is alive again:
        not counted)."""
        if fault == "requeue":
            return 0
        self.cluster.wait_state(a, ("CANCELLED", "TIMEOUT", "COMPLETED", "FAILED"), 120)
        time.sleep(5)
        tag = f"RAAS_NODE={self.cluster.node}-{a}".encode()
        count = 0
        for pid in self.our_pids():
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            count += any(e == tag or e.startswith(tag + b"-") for e in env)
        return count

    def measure(self, job_id: str, report: SlurmReport, before: dict[str, int], n: int, samples: int) -> None:
        """Fill `report` from the job's results and the simulator's counts since `before`."""
        view = self.client.job(job_id)
        report.outcomes = view.outcomes or {}
        report.lost = view.n_rollouts - view.finished
        results = _all_results(self.client, job_id)
        ids = [r.rollout_id for r in results]
        report.duplicated = len(ids) - len(set(ids))
        index = {p["instance_id"]: k for k, p in enumerate(PROBLEMS)}
        with session_scope(self.settings.db_url) as s:
            report.tokens_regenerated += job_cost(s, job_id).regenerated_tokens
        for r in results:
            report.rerun_from_init += r.attempt > 1
            report.replayed_turns += int((r.metrics or {}).get("replayed_turns") or 0)
            report.agent_errors += r.outcome == "agent_error"
            if r.outcome != "completed":
                report.not_completed += 1
                continue
            report.completed += 1
            want = 1.0 if answers_right(index[r.instance_id]) else 0.0
            report.wrong_rewards += r.reward != want
            report.missing_tokens += not (r.prompt_ids and r.response_ids and r.loss_mask)
        after = sim_stats(self.sim_url)
        for p in PROBLEMS[:n]:  # first turns beyond one per sample: loops begun again
            key = f"turn:{p['problem']}:0"
            report.loops_regenerated += max(0, after.get(key, 0) - before.get(key, 0) - samples)
            again = sum(
                max(0, after.get(f"turn:{p['problem']}:{t}", 0) - before.get(f"turn:{p['problem']}:{t}", 0) - samples)
                for t in range(TURNS)
            )
            report.turns_regenerated += again
            report.turns_regenerated_max = max(report.turns_regenerated_max, -(-again // samples))

    def close(self) -> None:
        """Cancel our jobs, kill their orphans, stop the gateway and the simulator."""
        self.stop_nodes()
        import redis

        client = redis.Redis.from_url(self.redis_url)
        for key in client.scan_iter(f"{self.prefix}*"):
            client.delete(key)
        client.close()
        self.client.close()
        self._server.shutdown()
        self._stop_sim()


def sim_stats(url: str) -> dict[str, int]:
    return httpx.get(f"{url}/sim/stats", timeout=10).json()


def _all_results(client: RaasClient, job_id: str) -> list[RolloutView]:
    out, cursor = [], 0
    while True:
        page = client.results_page(job_id, after=cursor)
        out += page.items
        if not page.items or page.done:
            return out
        cursor = page.cursor


def _wait(predicate, timeout: float, what: str, context=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{context()[-3000:]}")


def dump(report: SlurmReport) -> str:
    """One JSON line."""
    return json.dumps(report.as_dict())


__all__ = ["SlurmReport", "SlurmScenario", "dump", "subprocess"]


def shared_env_root(home: Path) -> Path:
    """A shared environment root as a login node leaves it: `math` built, marked shared
    (the build itself is cached once per machine, as the fault suite does)."""
    from sandbox.environments import SHARED_MARK, build_environment

    built = Path(build_environment("math", ["sympy", "numpy"])).resolve()
    root = home / "envs-shared"
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "math").exists():
        (root / "math").symlink_to(built)
    (root / SHARED_MARK).write_text("compute nodes use these environments read-only\n")
    return root
