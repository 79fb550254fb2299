"""RUN hot path benchmark: 64 concurrent 4-turn rollouts against LLM servers with 1.0 s latency.

A real service (gateway, Celery worker processes per stage, PostgreSQL, Redis) runs the
`search` handler (host-side tools, no sandbox) against LLM simulator processes (a fake vLLM,
named as such) that answer every turn after a fixed latency: three `search` calls, then the
right `answer` (reward 1). With `slots` RUN slots and rollouts of `turns` turns of `latency`
seconds, no service can finish more than slots / (turns x latency) rollouts per second (the
latency bound: 64 / 4 = 16/s); the figure of merit is the steady-state fraction of it, over
windows of whole waves after the first sixth of the finishes (`hot_path_estimate`: the slots
free together, so rollouts finish in waves of `slots`; the old cut, first and last sixth
dropped, spans part-waves, 0.955 of the bound at zero overhead and moving with where it lands
in a wave). `steady_vs_bound_trimmed` is the old cut's figure, which the earlier runs of
docs/benchmarks-history.md report. CPU is read from /proc for every worker process (utime + stime, the simulators
and PostgreSQL excluded) over the measured job, after a warm-up job of one wave; the RUN
worker's stime is reported apart (`run_sys_ms_per_turn`). Issue 25's goal (steady share >= 0.95
of the bound, <= 6 ms of service CPU per turn) is checked per tree.
The RUN pool runs as `raas node` runs it: 64 slots at the default `max_slots_per_process` (32)
are two worker processes, whose CPU is summed (`--slots-per-process 64` adds a run of this tree
with one, as before the split; a baseline tree from before it starts one). `slot_time_split`
gives the mean, median and p90 per rollout of its RUN time, LLM time, tool time and the rest.
`--profile DIR` also records the (first) RUN worker with py-spy while the measured job runs
(`--profile-mode`: `gil` samples the thread holding the GIL, `active` every thread not idle,
`idle` every thread; `pip install py-spy` into the venv, not a dependency).

Before/after in one run: the baseline commit (`--baseline`, default 635fdca, the tree before
issue 16's hot-path work) is `git archive`d into a temp dir and run with PYTHONPATH there, then
this tree; each in its own process (`--one`), in turn, on the same machine.

Usage: .venv/bin/python bench/hot_path.py [--quick] [--baseline REV | --baseline-tree DIR]
       [--profile DIR [--profile-mode gil|active|idle]] [--slots-per-process N] [--also KEY=VALUE,...]
(needs Redis :6379 and PostgreSQL :5432)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from hot_path_estimate import steady_rate, steady_rate_trimmed  # bench/, beside this file
from hot_path_profile import PROFILE_MODES, profile, profile_summary

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
REDIS = "redis://127.0.0.1:6379/0"
QUESTION = {"question": "What is the default maxsize of the functools.lru_cache decorator?", "answers": ["128"]}


def call(name: str, **arguments: str) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def script(turns: int, latency: float) -> dict:
    """`turns - 1` searches, then the right answer; every reply after `latency` seconds."""
    searches = [call("search", query=q) for q in ("lru_cache maxsize", "functools cache", "lru_cache typed")]
    replies = [searches[i % len(searches)] for i in range(turns - 1)] + [call("answer", text="128")]
    return {"default": replies, "latency": latency}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_times(pid: int) -> tuple[float, float]:
    """(utime, stime) of a process (all its threads) from /proc, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads)."""
    return sum(cpu_times(pid))


def fresh_database() -> tuple[str, callable]:
    import sqlalchemy as sa

    db = f"raas_hot_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{db}"'))

    def drop() -> None:
        from core.db import dispose_all

        dispose_all(close=True)
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))

    return PG_ADMIN.rsplit("/", 1)[0] + f"/{db}", drop


def wait_all(svc, job_id: str, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        j = svc.client.job(job_id)
        if j.finished >= j.n_rollouts:
            return
        time.sleep(0.1)
    raise TimeoutError(f"{job_id}: {svc.client.job(job_id)}\n{svc.log_tail()}")


def finish_offsets(db_url: str, job_id: str) -> list[float]:
    import sqlalchemy as sa

    from core.db import session_scope
    from core.models import Rollout

    with session_scope(db_url) as s:
        rows = s.execute(sa.select(Rollout.created_at, Rollout.finished_at).where(Rollout.job_id == job_id)).all()
    return sorted((f - c).total_seconds() for c, f in rows)


def turns_and_rewards(db_url: str, job_id: str) -> tuple[int, list]:
    import sqlalchemy as sa

    from core.db import session_scope
    from core.models import Rollout, Turn

    with session_scope(db_url) as s:
        turns = s.scalar(
            sa.select(sa.func.count())
            .select_from(Turn)
            .join(Rollout, Rollout.id == Turn.rollout_id)
            .where(Rollout.job_id == job_id)
        )
        rewards = s.scalars(sa.select(Rollout.reward).where(Rollout.job_id == job_id)).all()
    return turns, list(rewards)


def slot_time_split(db_url: str, job_id: str) -> dict:
    """Mean, median and p90 per rollout of where its RUN slot's time went: the stage as a whole
    (`run_seconds`, claim to hand-on), the LLM calls (`gen_seconds`, the servers' latency
    included), the tools (`tool_seconds`), and what is left (the service's own latency)."""
    import sqlalchemy as sa

    from core.db import session_scope
    from core.models import Rollout, Turn

    with session_scope(db_url) as s:
        rows = s.execute(
            sa.select(
                Rollout.run_seconds,
                sa.func.sum(Turn.gen_seconds),
                sa.func.sum(Turn.tool_seconds),
                Rollout.init_seconds,
                Rollout.eval_seconds,
            )
            .join(Turn, Turn.rollout_id == Rollout.id)
            .where(Rollout.job_id == job_id)
            .group_by(Rollout.id)
        ).all()
    if not rows:
        return {}
    columns = {
        "run_ms": [r[0] or 0 for r in rows],
        "gen_ms": [r[1] or 0 for r in rows],
        "tool_ms": [r[2] or 0 for r in rows],
        "run_rest_ms": [(r[0] or 0) - (r[1] or 0) - (r[2] or 0) for r in rows],
        "init_ms": [r[3] or 0 for r in rows],
        "eval_ms": [r[4] or 0 for r in rows],
    }
    ms = lambda value: round(value * 1000, 1)  # noqa: E731
    return {
        name: {
            "p50": ms(statistics.median(values)),
            "mean": ms(statistics.fmean(values)),
            "p90": ms(statistics.quantiles(values, n=10)[-1]) if len(values) > 1 else ms(values[0]),
        }
        for name, values in columns.items()
    }


def stage_pids(svc) -> dict[str, list[int]]:
    """Every worker process of each stage: a pool past `max_slots_per_process` is several
    (`app.ops.node.process_slots`); a tree from before that split has one per stage."""
    processes = getattr(svc, "processes", None) or {key: [proc] for key, proc in svc.workers.items()}
    return {stage: [proc.pid for proc in procs] for (stage, _node), procs in processes.items()}


def start_simulator(tokenizer: str, script_file: Path) -> tuple[str, callable]:
    """An LLM simulator process, always this tree's (the instrument, the same for both)."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fakellm.cli",
            "--tokenizer",
            tokenizer,
            "--script",
            str(script_file),
            "--port",
            str(port),
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            time.sleep(0.1)

    def stop() -> None:
        proc.kill()
        proc.wait(10)

    return url, stop


# Issue 25's goal for this bench: the steady share of the latency bound, and the service's CPU
# (INIT + RUN + EVAL worker processes) per turn.
GOAL_SHARE, GOAL_CPU_MS_PER_TURN = 0.95, 6.0


def run_one(args: argparse.Namespace) -> dict:
    """One tree (the one on PYTHONPATH): warm-up wave, then the measured job."""
    import tasks
    from bench.support.pipeline_harness import start_service

    tree = Path(tasks.__file__).resolve().parent.parent
    tokenizer = str(tree / "tests" / "fixtures" / "smollm2-tokenizer")
    db_url, drop = fresh_database()
    stops = []
    with tempfile.TemporaryDirectory() as home:
        script_file = Path(home) / "script.json"
        script_file.write_text(json.dumps(script(args.turns, args.latency)))
        try:
            urls = []
            for _ in range(args.servers):
                url, stop = start_simulator(tokenizer, script_file)
                urls.append(url)
                stops.append(stop)
            svc = start_service(
                Path(home),
                db_url=db_url,
                broker_url=REDIS,
                key_prefix=f"raas-hot-{uuid.uuid4().hex[:8]}:",
                nodes=("bench",),
                reaper=False,
                concurrency={"init": 8, "run": args.slots, "eval": 8},
                extra={
                    **{
                        k: v
                        for k, v in (
                            ("db_pool_size", args.db_pool_size),
                            ("max_slots_per_process", args.slots_per_process),
                        )
                        if v
                    },
                    **dict(parse_setting(text) for text in args.setting),
                }
                or None,
            )
            stops.append(svc.stop)
            for url in urls:
                svc.client.add_llm_server(url)
            job_kwargs = {
                "limits": {"max_turns": args.turns + 2},
                "llm": {"tokenizer": tokenizer, "max_model_len": 16384},
                "sampling": {"max_tokens": 256},
            }

            def submit(n: int, tag: str) -> str:
                instances = [{"instance_id": f"{tag}{k}", "data": QUESTION} for k in range(n)]
                return svc.client.submit("search", instances, **job_kwargs).job_id

            wait_all(svc, submit(args.slots, "warm"))
            pids = stage_pids(svc)
            cpu0 = {stage: sum(map(cpu_seconds, ps)) for stage, ps in pids.items()}
            sys0 = sum(cpu_times(pid)[1] for pid in pids["run"])
            spy = None
            if args.profile:
                expected = args.rollouts / (args.slots / (args.turns * args.latency))
                out = Path(args.profile) / f"run-{args.label}.txt"
                spy = profile(pids["run"][0], expected * 0.8, out, args.profile_mode)
            t0 = time.monotonic()
            job = submit(args.rollouts, "r")
            wait_all(svc, job)
            wall = time.monotonic() - t0
            cpu = {stage: sum(map(cpu_seconds, ps)) - cpu0[stage] for stage, ps in pids.items()}
            run_sys = sum(cpu_times(pid)[1] for pid in pids["run"]) - sys0
            if spy is not None:
                spy.wait(300)
            done = finish_offsets(db_url, job)
            turns, rewards = turns_and_rewards(db_url, job)
            split = slot_time_split(db_url, job)
        finally:
            for stop in reversed(stops):
                stop()
            drop()
    n = args.rollouts
    bound = args.slots / (args.turns * args.latency)
    steady, steady_trimmed = steady_rate(done, args.slots), steady_rate_trimmed(done)
    total_cpu = sum(cpu.values())
    return {
        "tree": args.label,
        "rollouts": n,
        "slots": args.slots,
        "turns_per_rollout": args.turns,
        "servers": args.servers,
        "latency_s": args.latency,
        "turns_recorded": turns,
        "reward_1": sum(r == 1.0 for r in rewards),
        "wall_s": round(wall, 2),
        "rollouts_per_s": round(n / wall, 3),
        "steady_rollouts_per_s": round(steady, 3),
        "latency_bound_per_s": bound,
        "steady_vs_bound": round(steady / bound, 3),
        "steady_vs_bound_trimmed": round(steady_trimmed / bound, 3),
        "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
        "run_processes": len(pids["run"]),
        "cores_used": round(total_cpu / wall, 2),
        "cpu_ms_per_rollout": round(total_cpu / n * 1000, 1),
        "cpu_ms_per_turn": round(total_cpu / turns * 1000, 2) if turns else None,
        "run_cpu_ms_per_turn": round(cpu["run"] / turns * 1000, 2) if turns else None,
        "run_sys_ms_per_turn": round(run_sys / turns * 1000, 2) if turns else None,
        "finish_p50_s": round(statistics.median(done), 2),
        "finish_deciles_s": [round(done[min(n - 1, n * k // 10)], 1) for k in range(11)],
        "slot_time_split": split,
        "slot_ms_per_rollout": round(args.slots / steady * 1000, 1),
        "goal_share_met": steady / bound >= GOAL_SHARE,
        "goal_cpu_met": bool(turns) and total_cpu / turns * 1000 <= GOAL_CPU_MS_PER_TURN,
        "run_profile": profile_summary(Path(args.profile) / f"run-{args.label}.txt") if args.profile else None,
    }


def archive(rev: str, into: Path) -> Path:
    """`git archive rev` unpacked into `into` (the baseline tree)."""
    tar = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)
    return into


def parse_setting(text: str) -> tuple[str, object]:
    """`KEY=VALUE` (a Settings field, lower case) with VALUE read as JSON when it parses."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise SystemExit(f"--setting/--also wants KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def run_tree(
    label: str,
    tree: Path,
    args: argparse.Namespace,
    pool_size: int | None = None,
    per_process: int | None = None,
    settings: list[str] = (),
) -> dict:
    """This script's `--one` in a child process whose imports come from `tree`."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--one",
        "--label",
        label,
        "--rollouts",
        str(args.rollouts),
        "--slots",
        str(args.slots),
        "--turns",
        str(args.turns),
        "--servers",
        str(args.servers),
        "--latency",
        str(args.latency),
    ]
    if args.profile:
        cmd += ["--profile", args.profile, "--profile-mode", args.profile_mode]
    if pool_size:
        cmd += ["--db-pool-size", str(pool_size)]
    if per_process:
        cmd += ["--slots-per-process", str(per_process)]
    for text in settings:
        cmd += ["--setting", text]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(cmd, env=env, cwd=tree, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="192 rollouts instead of 640")
    parser.add_argument("--baseline", default="635fdca", help="git revision of the 'before'")
    parser.add_argument(
        "--baseline-tree", default=None, help="an unpacked 'before' tree to use instead of archiving --baseline"
    )
    parser.add_argument("--profile", default=None, help="py-spy the RUN worker into DIR")
    parser.add_argument("--profile-mode", choices=sorted(PROFILE_MODES), default="gil", help="what py-spy samples")
    parser.add_argument("--rollouts", type=int, default=None)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--only", choices=["before", "after"], default=None)
    parser.add_argument(
        "--db-pool-size",
        type=int,
        default=None,
        help="also run this tree with RAAS_DB_POOL_SIZE=N (default 4 per process)",
    )
    parser.add_argument(
        "--slots-per-process",
        type=int,
        default=None,
        help="also run this tree with RAAS_MAX_SLOTS_PER_PROCESS=N (default 32: 64 RUN slots are two "
        "processes; 64 runs them in one, as before the split)",
    )
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        help="also run this tree with KEY=VALUE[,KEY=VALUE] settings (repeatable), "
        "e.g. db_pool_size=8,turn_batch_window=0.01",
    )
    parser.add_argument("--setting", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--label", default="after", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.rollouts = args.rollouts or (192 if args.quick else 640)
    if args.one:
        print(json.dumps(run_one(args)))
        return
    for also in args.also:  # a malformed one fails now, not after the other runs
        [parse_setting(text) for text in also.split(",")]
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    report = []
    with tempfile.TemporaryDirectory() as base:
        trees = {
            "before": lambda: Path(args.baseline_tree) if args.baseline_tree else archive(args.baseline, Path(base)),
            "after": lambda: REPO,
        }
        for label in ("before", "after"):
            if args.only in (None, label):
                report.append(run_tree(label, trees[label](), args))
        if args.db_pool_size and args.only in (None, "after"):
            report.append(run_tree(f"after, db_pool_size {args.db_pool_size}", REPO, args, args.db_pool_size))
        if args.slots_per_process and args.only in (None, "after"):
            label = f"after, {args.slots_per_process} slots per process"
            report.append(run_tree(label, REPO, args, per_process=args.slots_per_process))
        for also in args.also if args.only in (None, "after") else ():
            report.append(run_tree(f"after, {also}", REPO, args, settings=also.split(",")))
    print(json.dumps(report, indent=2))
    print(
        "\n| tree | rollouts | steady/s | bound/s | steady/bound | steady/bound (old cut) | wall s | cores | "
        "CPU ms/rollout | CPU ms/turn | RUN CPU ms/turn | RUN processes | reward 1 |"
    )
    print("|" + " --- |" * 13)
    for r in report:
        print(
            f"| {r['tree']} | {r['rollouts']} | {r['steady_rollouts_per_s']} | "
            f"{r['latency_bound_per_s']} | {r['steady_vs_bound']} | {r['steady_vs_bound_trimmed']} | "
            f"{r['wall_s']} | {r['cores_used']} | {r['cpu_ms_per_rollout']} | {r['cpu_ms_per_turn']} | "
            f"{r['run_cpu_ms_per_turn']} | {r.get('run_processes', 1)} | {r['reward_1']} |"
        )
    print(f"\nissue 25 goal: steady/bound >= {GOAL_SHARE} and service CPU <= {GOAL_CPU_MS_PER_TURN} ms per turn")
    for r in report:
        share = "met" if r.get("goal_share_met") else "NOT met"
        cpu = "met" if r.get("goal_cpu_met") else "NOT met"
        print(f"- {r['tree']}: share of the bound {r['steady_vs_bound']} ({share}), ", end="")
        print(f"{r['cpu_ms_per_turn']} ms/turn ({cpu})")


if __name__ == "__main__":
    main()
