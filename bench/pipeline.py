"""Pipeline benchmark: trivial-rollout throughput and stage overlap. Prints JSON + a table.

(a) Throughput and per-rollout overhead with a trivial handler (no sandbox, no LLM), on the
    embedded default (SQLite + embedded Redis) and on Redis + PostgreSQL.
(b) Stage overlap with sleep-bound stages (INIT 1 s, RUN 2 s, EVAL 1 s): three pools (3/6/3)
    vs the baseline, one pool that runs the three stages back to back per rollout through the
    same stage code (bench/serial_worker.py): with the same total concurrency (12), and sized
    to what a node can afford for INIT (3 concurrent sandbox starts): a serial slot may be in
    INIT at any moment, so a node that can start only 3 sandboxes at once can run only 3.
(c) Math EVAL: `examples/math.jsonl` through the whole pipeline (bwrap sandboxes, the `math`
    environment, the LLM simulator's demo policy, a fake model) on the embedded default, graded
    in the persistent grading process; then the same answers graded the old way, a new
    process per answer (`grade_in_fresh_process`, kept here as the baseline), from threads as
    EVAL's pool grades.

(a) counts the workers' statements, commits and publishes per rollout too (every thread of
    every worker, bench/capacity_probe.py). `--baseline-tree DIR` runs (a) for that tree and
    this one alternately, each in a child process whose code and workers come from its tree.

Usage: .venv/bin/python bench/pipeline.py [--quick] [--only throughput|overlap|math-eval]
       [--baseline-tree DIR [--repeat N]]
(needs Redis :6379 and PostgreSQL :5432 for (a) and (b))
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
# `--tree DIR` (a child of `--baseline-tree`): that tree's code, this script's measurement.
TREE = Path(sys.argv[sys.argv.index("--tree") + 1]) if "--tree" in sys.argv else REPO
sys.path.insert(0, str(TREE))

from bench.support.pipeline_harness import start_service  # noqa: E402

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
REDIS = "redis://127.0.0.1:6379/0"


def backend(name: str) -> tuple[dict, callable]:
    """Service keyword arguments for a backend and a cleanup function."""
    if name == "embedded":
        return {}, lambda: None
    db = f"raas_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{db}"'))

    def drop() -> None:
        from core.db import dispose_all

        dispose_all(close=True)
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))

    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{db}"
    return {"db_url": url, "broker_url": REDIS, "key_prefix": f"raas-bench-{db}:"}, drop


def wait_all(svc, job_id: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        j = svc.client.job(job_id)
        if j.finished >= j.n_rollouts:
            return
        time.sleep(0.05)
    raise TimeoutError(job_id)


def finish_times(svc, job_id: str) -> list[float]:
    from core.db import session_scope
    from core.models import Rollout

    with session_scope(svc.settings.db_url) as s:
        rows = s.execute(sa.select(Rollout.created_at, Rollout.finished_at).where(Rollout.job_id == job_id)).all()
    return sorted((f - c).total_seconds() for c, f in rows)


def worker_ops(folder: Path) -> dict[str, dict[str, float]]:
    """What the workers' probes (bench/capacity_probe.py) counted so far, per stage."""
    total: dict[str, dict[str, float]] = {}
    for path in folder.glob("*.json"):
        for stage, counts in json.loads(path.read_text()).items():
            mine = total.setdefault(stage, {})
            for key, value in counts.items():
                mine[key] = mine.get(key, 0) + value
    return total


def ops_per_rollout(before: dict, after: dict, n: int) -> dict[str, float]:
    """Statements, commits and publishes per rollout between two probe readings (every
    thread of every worker: stages, heartbeat, writer threads)."""
    sums = {}
    for key in ("statements", "commits", "publishes", "acks"):
        total = sum(c.get(key, 0) for c in after.values()) - sum(c.get(key, 0) for c in before.values())
        sums[key] = round(total / n, 2)
    return sums


def throughput(name: str, n: int) -> dict:
    """(a): a batch of n trivial rollouts, then single rollouts on an idle service."""
    import os

    kwargs, cleanup = backend(name)
    with tempfile.TemporaryDirectory() as home:
        probe_dir = Path(home) / "probe"
        probe_dir.mkdir()
        os.environ["CAPACITY_PROBE_DIR"] = str(probe_dir)  # the workers' environment
        svc = start_service(
            Path(home), nodes=("bench",), concurrency=4, reaper=False, handler_modules="bench.capacity_probe", **kwargs
        )
        try:
            warm = svc.client.submit("test-trivial", [{"instance_id": "warm"}])
            wait_all(svc, warm.job_id)
            time.sleep(1.2)  # the probes' last per-second dump of the warm-up
            ops0 = worker_ops(probe_dir)
            instances = [{"instance_id": f"i{k}"} for k in range(n)]
            t0 = time.monotonic()
            job = svc.client.submit("test-trivial", instances)
            submitted = time.monotonic() - t0
            wait_all(svc, job.job_id)
            wall = time.monotonic() - t0
            time.sleep(1.2)
            ops = ops_per_rollout(ops0, worker_ops(probe_dir), n)
            latencies = []
            for k in range(10):
                one = svc.client.submit("test-trivial", [{"instance_id": f"solo{k}"}])
                wait_all(svc, one.job_id)
                latencies.append(finish_times(svc, one.job_id)[0])
        finally:
            svc.stop()
            cleanup()
    return {
        "tree": TREE.name if TREE != REPO else "this tree",
        "backend": name,
        "rollouts": n,
        "submit_s": round(submitted, 3),
        "wall_s": round(wall, 3),
        "rollouts_per_s": round(n / wall, 1),
        "solo_latency_p50_ms": round(statistics.median(latencies) * 1000, 1),
        "worker_ops_per_rollout": ops,
    }


def throughput_trees(baseline: Path, n: int, repeat: int) -> list[dict]:
    """(a) for the baseline tree and this one, alternating, each backend, each in a child
    process whose code (and workers) come from its tree."""
    rows = []
    for _ in range(repeat):
        for name in ("embedded", "redis+postgresql"):
            for tree in (baseline, REPO):
                cmd = [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--one-throughput",
                    name,
                    "--n",
                    str(n),
                    "--tree",
                    str(tree),
                ]
                out = subprocess.run(cmd, cwd=tree, check=True, capture_output=True, text=True)
                row = json.loads(out.stdout.strip().splitlines()[-1])
                row["tree"] = "before" if tree == baseline else "after"
                rows.append(row)
    return rows


def overlap(mode: str, n: int, serial_slots: int = 12) -> dict:
    """(b): sleep-bound stages, three pools vs one serial pool of `serial_slots`."""
    kwargs, cleanup = backend("redis+postgresql")
    conc = {"init": 3, "run": 6, "eval": 3}
    with tempfile.TemporaryDirectory() as home:
        stages = ("init", "run", "eval") if mode == "three-pools" else ()
        svc = start_service(Path(home), nodes=("bench",), concurrency=conc, reaper=False, stages=stages, **kwargs)
        serial = None
        if mode == "serial-pool":
            serial = subprocess.Popen(
                [sys.executable, str(REPO / "bench/serial_worker.py"), "--concurrency", str(serial_slots)],
                env={**svc.env, "RAAS_NODE": "bench"},
                cwd=REPO,
            )
        try:
            cfg = {"init_s": 1.0, "run_s": 2.0, "eval_s": 1.0, "turns": 1}
            t0 = time.monotonic()
            job = svc.client.submit("test-sleepy", [{"instance_id": f"i{k}"} for k in range(n)], agent_config=cfg)
            wait_all(svc, job.job_id)
            wall = time.monotonic() - t0
            done = finish_times(svc, job.job_id)
        finally:
            if serial:
                serial.terminate()
                serial.wait(30)
            svc.stop()
            cleanup()
    bound = min(conc["init"] / 1.0, conc["run"] / 2.0, conc["eval"] / 1.0) if stages else serial_slots / 4.0
    lo, hi = n // 6, n - n // 6  # steady state: drop the fill and the drain
    steady = (hi - lo) / (done[hi - 1] - done[lo - 1])
    return {
        "mode": mode,
        "rollouts": n,
        "concurrency": conc if stages else serial_slots,
        "wall_s": round(wall, 2),
        "rollouts_per_s": round(n / wall, 3),
        "steady_rollouts_per_s": round(steady, 3),
        "bottleneck_bound_per_s": bound,
        "steady_vs_bound": round(steady / bound, 3),
    }


# The baseline grader: a fresh interpreter per answer, as EVAL graded before the persistent
# grading process (its main thread grades in-process).
FRESH_GRADER = (
    "import json, sys; from dataclasses import asdict; "
    "from agents.handlers.math.answer import grade_math_answer; r = json.load(sys.stdin); "
    "print(json.dumps(asdict(grade_math_answer(r['predicted'], r['reference'], timeout_s=5))))"
)


def grade_in_fresh_process(predicted: str | None, reference: str) -> tuple[float, float]:
    """(reward, seconds) of one answer graded in a new Python process (the baseline)."""
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", FRESH_GRADER],
        input=json.dumps({"predicted": predicted, "reference": reference}),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["reward"], time.monotonic() - t0


def math_eval(n: int) -> list[dict]:
    """(c): math rollouts through the service (warm grading), then their answers graded by
    the baseline, a new process per answer, 4 at a time (EVAL's pool)."""
    from concurrent.futures import ThreadPoolExecutor

    from fakellm.server import BUNDLED_TOKENIZER, DEFAULT_SCRIPT, start_simulator
    from sandbox.environments import build_environment

    rows = [json.loads(line) for line in (REPO / "examples/math.jsonl").read_text().splitlines()]
    instances = [
        {"instance_id": f"{r['instance_id']}-{k}", "data": r} for k in range(n // len(rows) + 1) for r in rows
    ][:n]
    url, stop_sim = start_simulator(str(BUNDLED_TOKENIZER), DEFAULT_SCRIPT)
    with tempfile.TemporaryDirectory() as home:
        (Path(home) / "envs").mkdir()
        (Path(home) / "envs" / "math").symlink_to(build_environment("math", ["numpy", "sympy"]))
        svc = start_service(Path(home), nodes=("bench",), concurrency=4, reaper=False)
        try:
            job = svc.client.submit("math", instances, llm={"servers": [{"url": url}]})
            t0 = time.monotonic()
            wait_all(svc, job.job_id)
            wall = time.monotonic() - t0
            done = svc.all_results(job.job_id)
            details = [svc.client.rollout(r.rollout_id) for r in done]
        finally:
            svc.stop()
            stop_sim()
    evals = [r.timing.eval for r in done if r.timing.eval is not None]
    answers = [(d.extra["predicted_answer"], d.extra["reference_answer"]) for d in details]
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        fresh = list(pool.map(lambda a: grade_in_fresh_process(*a), answers))
    fresh_wall = time.monotonic() - t0
    return [
        {
            "grading": "a new process per answer (baseline)",
            "answers": len(fresh),
            "rewarded": sum(reward == 1.0 for reward, _ in fresh),
            "grading_p50_s": round(statistics.median(s for _, s in fresh), 4),
            "grading_p90_s": round(statistics.quantiles([s for _, s in fresh], n=10)[-1], 4),
            "eval_p50_s": None,
            "wall_s": round(fresh_wall, 2),
        },
        {
            "grading": "warm grading process (EVAL)",
            "answers": len(done),
            "rewarded": sum(r.reward == 1.0 for r in done),
            "grading_p50_s": round(statistics.median(d.metrics["grading_seconds"] for d in details), 4),
            "grading_p90_s": round(statistics.quantiles([d.metrics["grading_seconds"] for d in details], n=10)[-1], 4),
            "eval_p50_s": round(statistics.median(evals), 3),
            "wall_s": round(wall, 2),
        },
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller batches")
    parser.add_argument("--only", choices=["throughput", "overlap", "math-eval"], default=None)
    parser.add_argument(
        "--baseline-tree", default=None, help="(a) also for this tree (e.g. a worktree of main), alternating"
    )
    parser.add_argument("--repeat", type=int, default=1, help="(a) rounds with --baseline-tree")
    parser.add_argument("--n", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--tree", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--one-throughput", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_throughput:
        print(json.dumps(throughput(args.one_throughput, args.n)))
        return
    n_trivial, n_sleepy, n_math = (200, 30, 24) if args.quick else (1000, 90, 42)
    wanted = {args.only} if args.only else {"throughput", "overlap", "math-eval"}
    report: dict = {"throughput": [], "overlap": [], "math_eval": []}
    if "throughput" in wanted and args.baseline_tree:
        report["throughput"] = throughput_trees(Path(args.baseline_tree), n_trivial, args.repeat)
    elif "throughput" in wanted:
        report["throughput"] = [throughput(b, n_trivial) for b in ("embedded", "redis+postgresql")]
    if "overlap" in wanted:
        report["overlap"] = [
            overlap("three-pools", n_sleepy),
            overlap("serial-pool", n_sleepy, 12),
            overlap("serial-pool", n_sleepy // 3, 3),
        ]
    if "math-eval" in wanted:
        report["math_eval"] = math_eval(n_math)
    print(json.dumps(report, indent=2))
    print("\n| math grading | answers | reward 1 | grading p50 s | grading p90 s | EVAL p50 s | wall s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in report["math_eval"]:
        print(
            f"| {r['grading']} | {r['answers']} | {r['rewarded']} | {r['grading_p50_s']} | "
            f"{r['grading_p90_s']} | {r['eval_p50_s'] or '-'} | {r['wall_s']} |"
        )
    print(
        "\n| tree | backend | rollouts | wall s | rollouts/s | solo latency p50 ms | "
        "statements/rollout | commits/rollout | publishes/rollout |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in report["throughput"]:
        ops = r.get("worker_ops_per_rollout", {})
        print(
            f"| {r.get('tree', '')} | {r['backend']} | {r['rollouts']} | {r['wall_s']} | "
            f"{r['rollouts_per_s']} | {r['solo_latency_p50_ms']} | "
            f"{ops.get('statements')} | {ops.get('commits')} | {ops.get('publishes')} |"
        )
    print("\n| mode | slots | rollouts | wall s | rollouts/s | steady/s | bound/s | steady/bound |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in report["overlap"]:
        slots = (
            "/".join(map(str, r["concurrency"].values())) if isinstance(r["concurrency"], dict) else r["concurrency"]
        )
        print(
            f"| {r['mode']} | {slots} | {r['rollouts']} | {r['wall_s']} | {r['rollouts_per_s']} | "
            f"{r['steady_rollouts_per_s']} | {r['bottleneck_bound_per_s']} | "
            f"{r['steady_vs_bound']} |"
        )


if __name__ == "__main__":
    main()
