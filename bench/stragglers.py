"""Straggler cut: the same job with and without spare samples, against a long-tail simulator.

A GRPO step waits for its groups, and a group waits for its slowest sample. The simulator
(a fake model) answers every turn after a random delay with a long tail
(`fakellm/latency.py`: lognormal, median `--median` s, `--sigma`), and the job runs
the `test-chat` handler (bench/support/pipeline_handlers.py: `--turns` LLM turns per rollout, no
sandbox) through the real pipeline (Redis + PostgreSQL, real Celery workers). Runs:

- `plain`: n samples per instance, every group waits for all of them;
- `spare`: n + `--spare` samples per instance; a group completes with its first n usable
  samples and the rest are cut (their generations aborted);
- `deadline` (with `--group-timeout`): n samples and a per-group deadline.

Per run: the job's wall time until every group is complete and until every sample ended,
each group's completion time after submission (p50 / p90 / max), the simulator's requests and
aborted requests (what the spares cost). Each configuration runs `--repeats` times with other
seeds of the delay generator.

Usage: .venv/bin/python bench/stragglers.py [--quick] [--instances 8] [--n 4] [--spare 2]
       [--turns 2] [--median 0.4] [--sigma 1.0] [--repeats 2] [--group-timeout S]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from pipeline import backend, wait_all  # noqa: E402

from fakellm.server import BUNDLED_TOKENIZER, start_simulator  # noqa: E402
from bench.support.pipeline_harness import start_service  # noqa: E402

REPLY = 'I will look at the next part. <tool_call>{"name": "observe", "arguments": {}}</tool_call>'


def group_times(db_url: str, job_id: str, submitted: float) -> list[float]:
    """Seconds from submission to each group's completion (its closing row's finish)."""
    from core.db import session_scope
    from core.models import Rollout

    with session_scope(db_url) as s:
        rows = s.execute(
            sa.select(Rollout.finished_at).where(Rollout.job_id == job_id, Rollout.completes_group.is_(True))
        ).all()
    return sorted(r.finished_at.timestamp() - submitted for r in rows)


def one_run(kind: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One service, one simulator with the long tail, one job; its figures."""
    dist = {"kind": "lognormal", "median": args.median, "sigma": args.sigma, "cap": args.cap, "seed": seed}
    sim, stop_sim = start_simulator(str(BUNDLED_TOKENIZER), {"default": [REPLY], "latency_dist": dist})
    kwargs, cleanup = backend("redis+postgresql")
    conc = {"init": 4, "run": args.concurrency, "eval": 4}
    try:
        with tempfile.TemporaryDirectory() as home:
            svc = start_service(Path(home), nodes=("bench",), concurrency=conc, **kwargs)
            try:
                svc.client.add_llm_server(sim)
                warm = svc.client.submit(
                    "test-chat", [{"instance_id": "warm", "turns": 1}], agent_config={"observation_words": 20}
                )
                wait_all(svc, warm.job_id)
                before = httpx.get(f"{sim}/sim/stats").json()
                job_args: dict[str, Any] = {"n_samples": args.n, "agent_config": {"observation_words": 20}}
                if kind == "spare":
                    job_args["spare"] = args.spare
                if kind == "deadline":
                    job_args["group_timeout"] = args.group_timeout
                instances = [{"instance_id": f"g{k}", "turns": args.turns} for k in range(args.instances)]
                submitted = time.time()
                t0 = time.monotonic()
                job = svc.client.submit("test-chat", instances, **job_args)
                groups_done = None
                while True:  # poll the groups, then the last sample
                    view = svc.client.job(job.job_id)
                    if (
                        groups_done is None
                        and len(group_times(svc.settings.db_url, job.job_id, submitted)) == args.instances
                    ):
                        groups_done = time.monotonic() - t0
                    if view.finished >= view.n_rollouts:
                        break
                    time.sleep(0.1)
                wall = time.monotonic() - t0
                after = httpx.get(f"{sim}/sim/stats").json()
                rows = svc.all_results(job.job_id)
                times = group_times(svc.settings.db_url, job.job_id, submitted)
                members = sum(len(g) for g in svc.client.groups(job.job_id, wait=1))
            finally:
                svc.stop()
    finally:
        cleanup()
        stop_sim()
    return {
        "kind": kind,
        "seed": seed,
        "rollouts": len(rows),
        "groups_done_s": round(groups_done or wall, 2),
        "job_wall_s": round(wall, 2),
        "group_p50_s": round(statistics.median(times), 2),
        "group_p90_s": round(statistics.quantiles(times, n=10, method="inclusive")[-1], 2),
        "group_max_s": round(max(times), 2),
        "samples_in_groups": members,
        "cut": sum(1 for r in rows if r.cut_reason),
        "llm_requests": after.get("started", 0) - before.get("started", 0),
        "llm_aborted": after.get("aborted", 0) - before.get("aborted", 0),
    }


def summary(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Means over the repeats of each kind."""
    out = []
    for kind in dict.fromkeys(r["kind"] for r in runs):
        mine = [r for r in runs if r["kind"] == kind]
        row = {"kind": kind, "repeats": len(mine)}
        for key in (
            "groups_done_s",
            "job_wall_s",
            "group_p50_s",
            "group_p90_s",
            "group_max_s",
            "samples_in_groups",
            "cut",
            "llm_requests",
            "llm_aborted",
        ):
            row[key] = round(statistics.mean(r[key] for r in mine), 2)
        out.append(row)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| run | all groups done s | job wall s | group p50 s | group p90 s | group max s "
        "| samples in groups | cut | LLM requests | aborted |",
        "|" + " --- |" * 10,
    ]
    for r in rows:
        lines.append(
            f"| {r['kind']} | {r['groups_done_s']} | {r['job_wall_s']} | "
            f"{r['group_p50_s']} | {r['group_p90_s']} | {r['group_max_s']} | "
            f"{r['samples_in_groups']} | {r['cut']} | {r['llm_requests']} | "
            f"{r['llm_aborted']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--n", type=int, default=4, help="group size")
    parser.add_argument("--spare", type=int, default=2)
    parser.add_argument("--turns", type=int, default=2, help="LLM turns per rollout")
    parser.add_argument("--median", type=float, default=0.4, help="median seconds per turn")
    parser.add_argument("--sigma", type=float, default=1.0, help="lognormal spread")
    parser.add_argument("--cap", type=float, default=30.0, help="longest turn delay, s")
    parser.add_argument("--concurrency", type=int, default=48, help="RUN slots")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--group-timeout", type=float, default=None, help="also run n samples with this per-group deadline"
    )
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    if args.quick:
        args.instances, args.repeats = 4, 1
    kinds = ["plain", "spare"] + (["deadline"] if args.group_timeout else [])
    runs = [one_run(kind, args, seed) for seed in range(args.repeats) for kind in kinds]
    report = {
        "instances": args.instances,
        "n": args.n,
        "spare": args.spare,
        "turns": args.turns,
        "latency": {"median": args.median, "sigma": args.sigma, "cap": args.cap},
        "group_timeout": args.group_timeout,
        "runs": runs,
        "summary": summary(runs),
    }
    print(json.dumps(report, indent=2))
    print()
    print(table(report["summary"]))


if __name__ == "__main__":
    main()
