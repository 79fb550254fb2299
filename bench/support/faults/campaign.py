"""The fault campaign's service and its bookkeeping, shared by tests/faults and bench/faults.py.

A `Campaign` is what issue 15's campaign ran on: two nodes on Redis + PostgreSQL (private
instances, so a fault may restart them), per node an INIT, RUN and EVAL pool and a reaper,
each node with its own sandbox and workspace dirs (as on separate machines), a short lease,
and the LLM simulator (a fake vLLM, named as such) scripting 4-turn `math` rollouts in real
bwrap sandboxes: three python tool calls, then `finish`. One problem in four is answered
wrongly on purpose, so a right reward is proof of real work and not a default.

`run(fault, n)` submits a job, lets `fault` strike while it runs, waits until every rollout
is terminal (no human step: only the fault's own supervisor-like restarts), and returns a
`Report`: what was lost, duplicated, leaked or wasted. Tests assert on it; the bench prints it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import sqlalchemy as sa

from fakellm.server import start_simulator
from core.db import session_scope
from app.recovery_costs import job_cost
from core.models import Rollout
from core.settings import Settings
from bench.support.pipeline_harness import REPO, Service, start_service, wait_for
from bench.support.private_services import PrivatePostgres, PrivateRedis
from bench.support.faults.report import Report
from bench.support.tcp_proxy import ProxyProcess
from raas_client.models import JobAccepted, RolloutView

if TYPE_CHECKING:
    from bench.support.faults.faults import Fault

NODES = ("n1", "n2")
TURNS = 4
# A fault that must land between turns (the generation mark, the turn insert) rather than in
# a generation runs rollouts whose tool calls take this long (issue 40: a tool call is where a
# RUN is when the database goes away, and its next statement is the mark).
SLOW_TOOLS = "[slow tools] "
SLOW_TOOL_SECONDS = 0.8
LATENCY = 0.3  # seconds per LLM answer: a fault lands mid-rollout, a job stays short
SMOLLM2 = str(REPO / "tests" / "fixtures" / "smollm2-tokenizer")
# Issue 15's campaign had an 8 s lease; 6 s keeps recovery short and still outlasts the 3 s
# outages below (which take ~4 s with the restart itself).
# A submission that meets a broker outage is published by the reaper after `outbox_grace`
# (default 30 s: most of a Redis fault's job time); 5 s keeps the suite short.
RELIABILITY = {
    "lease_timeout": 6.0,
    "heartbeat_interval": 0.5,
    "requeue_after": 3.0,
    "reaper_interval": 0.5,
    "max_attempts": 4,
    "outbox_grace": 5.0,
    "soft_shutdown_timeout": 2.0,  # a SIGTERMed pool's drain (the node-drain fault)
    # a lost node's queues are judged after 12 s (a baseline tree has no setting)
    **({"node_timeout": 12.0} if "node_timeout" in Settings.model_fields else {}),
}
CONCURRENCY = {"init": 2, "run": 3, "eval": 1}
CONSUMER_FAULT_ENV = "CAMPAIGN_TRIGGERS"  # bench/support/faults/consumer_fault.py


def _problems() -> list[dict[str, Any]]:
    """Problems of examples/math.jsonl with an integer answer (exact grading, no ambiguity)."""
    rows = map(json.loads, (REPO / "examples" / "math.jsonl").read_text().splitlines())
    return [r for r in rows if re.fullmatch(r"-?\d+", str(r["answer"]))]


PROBLEMS = _problems()


def _call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def answers_right(index: int) -> bool:
    """Every fourth problem is answered wrongly (reward 0), the others rightly (reward 1)."""
    return index % 4 != 3


def script() -> dict[str, Any]:
    """The simulator's script: per problem, 3 python turns then `finish` with the answer; a
    problem submitted with the SLOW_TOOLS prefix gets tools that take SLOW_TOOL_SECONDS (the
    simulator takes the first key found in the prompt: the prefixed ones come first)."""
    slow, plain = {}, {}
    for k, p in enumerate(PROBLEMS):
        answer = p["answer"] if answers_right(k) else str(int(p["answer"]) + 1)
        finish = _call("finish", answer=answer)
        plain[p["problem"]] = [_call("python", code=f"print({t} + {k})") for t in range(TURNS - 1)] + [finish]
        code = f"import time; time.sleep({SLOW_TOOL_SECONDS}); print({{t}} + {k})"
        slow[SLOW_TOOLS + p["problem"]] = [_call("python", code=code.format(t=t)) for t in range(TURNS - 1)] + [finish]
    return {"latency": LATENCY, "by_instance": {**slow, **plain}}


def sim_stats(url: str) -> dict[str, int]:
    """The simulator's request counters."""
    return httpx.get(f"{url}/sim/stats", timeout=10).json()


class Campaign:
    """Two nodes on private Redis + PostgreSQL with the scripted simulator (see module doc)."""

    def __init__(self, home: Path, envs_math: Path | None = None, aof: bool = False, links: bool = False) -> None:
        self.home = home
        self.redis = PrivateRedis(aof=aof)
        self.redis.start()
        self.pg = PrivatePostgres()
        self.pg.start()
        # `links`: every node reaches PostgreSQL and Redis, and the gateway Redis, through a
        # proxy of its own (`bench.support.tcp_proxy`), keyed (node or "gateway", "pg" | "redis"): a
        # partition test cuts, slows or resets one of them (tests/partitions).
        self.links: dict[tuple[str, str], ProxyProcess] = {}
        if links:
            for end in (*NODES, "gateway"):
                self.links[end, "redis"] = ProxyProcess(self.redis.port)
            for end in NODES:
                self.links[end, "pg"] = ProxyProcess(self.pg.port)
        self.sim_url, self._stop_sim = start_simulator(SMOLLM2, script())
        if envs_math is not None:  # the handler's `math` environment, built once per machine
            (home / "envs").mkdir(parents=True, exist_ok=True)
            (home / "envs" / "math").symlink_to(envs_math)
        self.sandbox_dirs = {
            n: Path(tempfile.mkdtemp(prefix=f"raas-sbx-{n}-", dir="/tmp")) for n in NODES
        }  # short: socket paths are limited
        node_extra = {
            n: {"sandbox_dir": self.sandbox_dirs[n], "workspace_root": (home / f"ws-{n}").resolve()} for n in NODES
        }
        db_url = self.pg.create_database("raas")
        for n in NODES if links else ():
            node_extra[n]["database_url"] = _via(db_url, self.links[n, "pg"])
            node_extra[n]["broker_url"] = _via(self.redis.url, self.links[n, "redis"])
        (home / "logs").mkdir(parents=True, exist_ok=True)  # the reapers run in this process
        self._reaper_log = logging.FileHandler(home / "logs" / "reapers.log")
        self._reaper_log.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(message)s"))
        logging.getLogger("tasks").addHandler(self._reaper_log)
        logging.getLogger("tasks").setLevel(logging.INFO)
        self.triggers = home / "triggers"  # bench/support/faults/consumer_fault.py watches it
        self.triggers.mkdir(parents=True, exist_ok=True)
        os.environ[CONSUMER_FAULT_ENV] = str(self.triggers)  # inherited by every pool
        self.svc: Service = start_service(
            home,
            db_url=db_url,
            broker_url=_via(self.redis.url, self.links["gateway", "redis"]) if links else self.redis.url,
            nodes=NODES,
            concurrency=CONCURRENCY,
            reaper="per_node",
            node_extra=node_extra,
            handler_modules="bench.support.faults.consumer_fault",
            extra={**RELIABILITY, "sandbox_runtime": "bwrap"},
        )
        self.llm = {"servers": [{"url": self.sim_url}], "tokenizer": SMOLLM2, "max_model_len": 4096}
        self.lost_nodes: set[str] = set()
        self.prefixes: dict[str, str] = {}  # job id -> its problems' prefix (`submit`)
        self.registered = False  # the simulator is a registered server of the pool
        self.exits: list[str] = []  # pools that ended by themselves, as the supervisor saw
        self.supervising = True  # False: a pool that exits stays dead (no supervisor)
        self._lock = threading.Lock()
        self._closing = threading.Event()
        threading.Thread(target=self._supervise, name="supervisor", daemon=True).start()

    # -- the service ----------------------------------------------------------------------
    @property
    def db(self) -> str:
        """The service's database URL."""
        return self.svc.settings.db_url

    def rows(self, job_id: str) -> list[Rollout]:
        """The job's rollout rows, read directly."""
        with session_scope(self.db) as s:
            rows = s.scalars(sa.select(Rollout).where(Rollout.job_id == job_id)).all()
            s.expunge_all()
            return list(rows)

    def restart_pool(self, stage: str, node: str) -> None:
        """SIGKILL a pool and start it again at once (what a supervisor does)."""
        with self._lock:
            self.svc.kill_worker(stage, node)
            self.svc.start_worker(stage, node, CONCURRENCY[stage])

    def lose_node(self, node: str, stages: tuple[str, ...] = tuple(CONCURRENCY), reaper: bool = True) -> None:
        """SIGKILL `stages` pools of `node` (and stop its reaper) for good, until `heal`."""
        with self._lock:
            self.lost_nodes.add(node)
            if reaper:
                self.svc.stop_reaper(node)
            for stage in stages:
                if (stage, node) in self.svc.workers:
                    self.svc.kill_worker(stage, node)

    def _supervise(self) -> None:
        """Start again any pool that exited by itself (systemd's `Restart=on-failure`; a pool
        whose broker consumer died exits non-zero for this), except on a lost node."""
        while not self._closing.wait(0.5):
            with self._lock:
                for (stage, node), proc in list(self.svc.workers.items()):
                    if proc.poll() is None or node in self.lost_nodes or not self.supervising:
                        continue
                    self.exits.append(f"{stage}.{node} exited {proc.returncode}")
                    self.svc.workers.pop((stage, node))
                    self.svc.start_worker(stage, node, CONCURRENCY[stage])

    def drain_node(self, node: str) -> tuple[float, list[int]]:
        """SIGTERM every pool of `node` and stop its reaper (a node job ending); nothing
        restarts them until `heal`. Returns the seconds until all exited, and exit codes."""
        with self._lock:
            self.lost_nodes.add(node)
            self.svc.stop_reaper(node)
            procs = [self.svc.workers.pop((stage, node)) for stage in CONCURRENCY if (stage, node) in self.svc.workers]
        started = time.monotonic()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(120) for proc in procs]
        return round(time.monotonic() - started, 1), codes

    def fail_consumer_once(self, stage: str, node: str) -> None:
        """Make the consumer of `stage`'s pool on `node` raise once inside its loop."""
        (self.triggers / f"{stage}.{node}").touch()

    def dead_pools(self) -> list[str]:
        """Pools of nodes not lost on purpose whose process is gone."""
        with self._lock:
            return [
                f"{stage}.{node} exited {proc.returncode}"
                for (stage, node), proc in self.svc.workers.items()
                if proc.poll() is not None and node not in self.lost_nodes
            ]

    def heal(self) -> None:
        """Every pool and reaper running again (a fault that took a node away ends here)."""
        with self._lock:
            self.lost_nodes.clear()
            for node in NODES:
                for stage in CONCURRENCY:
                    proc = self.svc.workers.get((stage, node))
                    if proc is None or proc.poll() is not None:
                        self.svc.workers.pop((stage, node), None)
                        self.svc.start_worker(stage, node, CONCURRENCY[stage])
                if node not in self.svc.reapers:
                    self.svc.start_reaper(node)

    def submit(self, n: int, offset: int = 0, slow_tools: bool = False, registered: bool = False) -> JobAccepted:
        """A job of `n` distinct problems (each its own simulator script; `slow_tools`: their
        tool calls take SLOW_TOOL_SECONDS; `registered`: the simulator as a server of the
        shared pool, as a trainer registers its vLLM servers, instead of named by the job)."""
        if offset + n > len(PROBLEMS):
            raise ValueError(f"at most {len(PROBLEMS)} distinct problems")
        prefix = SLOW_TOOLS if slow_tools else ""
        instances = [
            {"instance_id": p["instance_id"], "data": {"problem": prefix + p["problem"], "answer": p["answer"]}}
            for p in PROBLEMS[offset : offset + n]
        ]
        llm = self.llm
        if registered:
            if not self.registered:
                self.svc.client.add_llm_server(self.sim_url)
                self.registered = True
            llm = {k: v for k, v in llm.items() if k != "servers"}
        job = self.svc.client.submit("math", instances, llm=llm, limits={"max_turns": TURNS + 2})
        self.prefixes[job.job_id] = prefix
        return job

    # -- one faulted job ------------------------------------------------------------------
    def run(self, fault: Fault, timeout: float | None = None) -> Report:
        """Submit the fault's job, strike, wait for the end (and the fault's `after`),
        measure."""
        timeout = timeout or getattr(fault, "timeout", 90)
        self.heal()
        self.supervising = getattr(fault, "supervised", True)
        if self.redis.aof != fault.aof:
            self.redis.set_aof(fault.aof)
        report = Report(fault=fault.name, rollouts=fault.rollouts)
        before, leaks_before = sim_stats(self.sim_url), self.leftovers()
        exits_before = len(self.exits)
        started = time.monotonic()
        job = self.submit(
            fault.rollouts,
            slow_tools=getattr(fault, "slow_tools", False),
            registered=getattr(fault, "registered_pool", False),
        )
        fault.strike(self, job, report)
        jobs = [job, *report.extra_jobs]
        report.job_ids = [j.job_id for j in jobs]
        deadline = time.monotonic() + timeout
        for j in jobs:
            try:
                self.svc.wait_done(j.job_id, timeout=max(1.0, deadline - time.monotonic()))
            except AssertionError as exc:
                report.notes.append(str(exc).splitlines()[0][:300])
        report.seconds = round(time.monotonic() - started, 1)
        dead = self.dead_pools()
        self.supervising = True
        if fault.after is not None:
            fault.after(self, report)
        report.notes += [f"supervisor: {e}" for e in self.exits[exits_before:]]
        report.notes += [f"dead at the end: {d}" for d in dead]
        report.pools_exited = len(self.exits) - exits_before + len(dead)
        for j in jobs:
            self._measure(j, report, fault.outcomes)
        self._count_calls(jobs, before, report)
        self._count_leaks(leaks_before, report)
        return report

    def _measure(self, job: JobAccepted, report: Report, allowed: tuple[str, ...]) -> None:
        view = self.svc.client.job(job.job_id)
        report.finished += view.finished
        for k, v in (view.outcomes or {}).items():
            report.outcomes[k] = report.outcomes.get(k, 0) + v
            report.unexpected_outcomes += v if k not in allowed else 0
        report.lost += view.n_rollouts - view.finished
        results = self._results(job.job_id)
        ids = [r.rollout_id for r in results]
        report.duplicated += len(ids) - len(set(ids))
        seqs = sorted(r.seq for r in results)
        report.seq_gaps += sorted(set(range(1, len(seqs) + 1)) - set(seqs))
        index = {p["instance_id"]: k for k, p in enumerate(PROBLEMS)}
        for r in results:
            report.retried_rollouts += r.attempt > 1
            if r.attempt > 1 and report.affected_ids and r.rollout_id not in report.affected_ids:
                report.notes.append(f"retried, not affected: {r.rollout_id}: {self._history(r.rollout_id)}")
            metrics = r.metrics or {}
            report.replayed_turns += int(metrics.get("replayed_turns") or 0)
            report.replay_divergences += len(metrics.get("replay_divergences") or [])
            if r.outcome != "completed":
                continue
            want = 1.0 if answers_right(index[r.instance_id]) else 0.0
            report.wrong_rewards += r.reward != want
            report.missing_tokens += not (r.prompt_ids and r.response_ids and r.loss_mask)
            turns = self.svc.client.rollout(r.rollout_id).turns or []
            report.repeated_turns += [t.index for t in turns] != list(range(TURNS))

    def _history(self, rollout_id: str) -> list[str]:
        """Why each earlier attempt of a rollout ended (a note names a retry nobody expected)."""
        with session_scope(self.db) as s:
            history = s.scalar(sa.select(Rollout.attempt_history).where(Rollout.id == rollout_id)) or []
        return [str(h.get("error"))[:160] for h in history]

    def _results(self, job_id: str) -> list[RolloutView]:
        """Every finished rollout so far, page by page (the SDK's `results()` would follow a
        job that never ends)."""
        out, cursor = [], 0
        while True:
            page = self.svc.client.results_page(job_id, after=cursor)
            out += page.items
            if not page.items or page.done:
                return out
            cursor = page.cursor

    def _count_calls(self, jobs: list[JobAccepted], before: dict[str, int], report: Report) -> None:
        after = sim_stats(self.sim_url)
        report.llm_calls = after.get("started", 0) - before.get("started", 0)
        problems = {p["instance_id"]: p["problem"] for p in PROBLEMS}
        looped = 0
        for j in jobs:
            with session_scope(self.db) as s:
                report.regenerated_tokens += job_cost(s, j.job_id).regenerated_tokens
            for row in self.rows(j.job_id):
                key = self.prefixes.get(j.job_id, "") + problems[row.instance_id]
                answered = [after.get(f"turn:{key}:{t}", 0) - before.get(f"turn:{key}:{t}", 0) for t in range(TURNS)]
                looped += answered[0] > 0
                report.rerun_rollouts += answered[0] > 1
                if row.id in report.affected_ids:
                    again = max(0, sum(answered) - TURNS)
                    report.affected_regenerated += again
                    report.affected_regenerated_max = max(report.affected_regenerated_max, again)
        report.regenerated_calls = max(0, report.llm_calls - TURNS * looped)

    def leftovers(self) -> tuple[set[int], set[Path]]:
        """Live bwrap pids under the campaign home; workspace and sandbox-state entries. A
        live worker's unclaimed warm sandboxes (`sandbox.pool`) are its pool, not a leak: a
        pool whose process died is orphaned, and then its members count."""
        warm_paths = self._warm_members()
        dirs = {p for n in NODES for p in _entries(self.home / f"ws-{n}") if p.name != "layers"}
        dirs |= {p for n in NODES for p in _entries(self.home / f"ws-{n}" / "layers")}  # group layers
        dirs |= {p for d in self.sandbox_dirs.values() for p in _entries(d)}
        live = {pid for pid, line in _live_bwraps(str(self.home)) if not any(w in line for w in map(str, warm_paths))}
        return live, dirs - warm_paths

    def _warm_members(self) -> set[Path]:
        """Files and folders of the live pools' unclaimed members (slot workspace, handle,
        log, signal file, socket folder)."""
        from sandbox.handles import orphaned, read_handles, unclaimed
        from sandbox.pool import slot_of

        paths: set[Path] = set()
        for folder in self.sandbox_dirs.values():
            for handle in read_handles(Path(folder)):
                if unclaimed(handle) and not orphaned(handle):
                    paths |= {
                        Path(handle[k])
                        for k in ("workspace", "handle_file", "log_file", "signal_file", "socket_dir")
                        if handle.get(k)
                    }
                    paths.add(Path(slot_of(handle)))  # a warm fork's folder holds its workspace
        return paths

    def _count_leaks(self, before: tuple[set[int], set[Path]], report: Report) -> None:
        """What the job left (beyond what was there before it), once the reapers had a few
        passes to clean up; an earlier fault's leak is that fault's, not counted again."""

        def new() -> tuple[set[int], set[Path]]:
            live, dirs = self.leftovers()
            return live - before[0], dirs - before[1]

        try:
            wait_for(lambda: new() == (set(), set()), timeout=10, what="no sandboxes left")
        except AssertionError:
            pass
        live, dirs = new()
        report.live_sandboxes_left, report.dirs_left = len(live), len(dirs)
        if dirs:  # name what stayed: the next failure says which folder or handle
            report.notes.append(f"left: {sorted(map(str, dirs))}")

    def close(self) -> None:
        """Stop everything this campaign started and delete its dirs."""
        self._closing.set()
        logging.getLogger("tasks").removeHandler(self._reaper_log)
        self._reaper_log.close()
        try:
            with self._lock:
                self.svc.stop()
            for pid, _ in _live_bwraps(str(self.home)):  # a leak a test reported: gone now
                os.kill(pid, signal.SIGKILL)
        finally:
            self._stop_sim()
            from core.db import dispose_all

            dispose_all(close=True)
            for link in self.links.values():
                link.close()
            self.pg.close()
            self.redis.close()
            for d in self.sandbox_dirs.values():
                shutil.rmtree(d, ignore_errors=True)


def _via(url: str, link: ProxyProcess) -> str:
    """`url` with its port replaced by the proxy's."""
    return sa.engine.make_url(url).set(port=link.port).render_as_string(hide_password=False)


def _entries(folder: Path) -> list[Path]:
    return list(folder.iterdir()) if folder.exists() else []


def _live_bwraps(root: str) -> list[tuple[int, str]]:
    """(pid, command line) of bwrap processes whose command line names a path under `root`."""
    out = subprocess.run(["pgrep", "-a", "bwrap"], capture_output=True, text=True).stdout
    return [(int(line.split()[0]), line) for line in out.splitlines() if root in line]
