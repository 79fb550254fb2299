"""Tool round trips and sandbox start/stop: raas vs SWE-ReX's BashSession vs tmux polling.

Benchmark-only install (never in setup.cfg):
    python3 -m venv .venv-bench && .venv-bench/bin/pip install swe-rex
Run (prints a table, then the JSON):
    .venv/bin/python bench/tools.py [--n 500] [--starts 30] [--tmux-n 10] [--json-out FILE]
The SWE-ReX figures come from a child process in .venv-bench (or --swerex-python).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOALS = {"bash_p50_ms": 2.0, "python_p50_ms": 2.0, "bwrap_start_p50_ms": 150.0, "speedup_vs_swerex": 50.0}


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50/p99 (nearest rank) in milliseconds."""
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000  # noqa: E731
    return {"n": len(ordered), "p50_ms": round(pick(0.50), 3), "p99_ms": round(pick(0.99), 3)}


def timed(fn, n: int, warmup: int = 5) -> list[float]:
    """Durations of n calls of fn after a warm-up."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def bench_raas(runtime: str, n: int, starts: int, workspace: str) -> dict[str, dict]:
    """Round trips through the public API plus start/stop times."""
    sys.path.insert(0, str(ROOT))
    from sandbox import SandboxSpec, get_runtime

    rt = get_runtime(runtime)
    spec = SandboxSpec(workspace=workspace)
    start_s, stop_s = [], []
    for _ in range(starts):
        begin = time.perf_counter()
        sb = rt.start(spec, label="bench:0")
        start_s.append(time.perf_counter() - begin)
        begin = time.perf_counter()
        sb.stop()
        stop_s.append(time.perf_counter() - begin)
    sb = rt.start(spec, label="bench:0")
    try:
        sb.write_file("view_me.py", "".join(f"line_{i} = {i}\n" for i in range(100)))
        assert sb.bash("echo hi").output == "hi\n"
        assert sb.python("1+1").output == "2\n"
        result = {
            "bash_echo": percentiles(timed(lambda: sb.bash("echo hi"), n)),
            "python_1+1": percentiles(timed(lambda: sb.python("1+1"), n)),
            "file_view": percentiles(timed(lambda: sb.edit("view", "view_me.py"), n)),
        }
    finally:
        sb.stop()
    result["start"] = percentiles(start_s)
    result["stop"] = percentiles(stop_s)
    return result


def swerex_worker(n: int) -> None:
    """Runs inside the bench venv: SWE-ReX BashSession timings as JSON on stdout."""
    from swerex.runtime.abstract import BashAction, CreateBashSessionRequest
    from swerex.runtime.local import BashSession

    async def main() -> dict:
        begin = time.perf_counter()
        session = BashSession(CreateBashSessionRequest())
        await session.start()
        started = time.perf_counter() - begin
        samples = []
        for i in range(n + 3):
            t0 = time.perf_counter()
            obs = await session.run(BashAction(command="echo hi", check="silent", timeout=10))
            if i >= 3:
                samples.append(time.perf_counter() - t0)
        assert obs.output.strip() == "hi", obs.output
        await session.close()
        return {"bash_echo": samples, "start": [started]}

    print(json.dumps(asyncio.run(main())))


def bench_swerex(python: str, n: int) -> dict[str, dict] | str:
    """SWE-ReX figures from the bench venv, or the reason they are missing."""
    if not os.path.exists(python):
        return f"no SWE-ReX interpreter at {python} (see the install step at the top)"
    run = subprocess.run(
        [python, __file__, "--swerex-worker", str(n)], capture_output=True, text=True, timeout=600, cwd="/tmp"
    )
    if run.returncode:
        return f"SWE-ReX run failed: {run.stderr[-500:]}"
    raw = json.loads(run.stdout.strip().splitlines()[-1])
    return {key: percentiles(values) for key, values in raw.items()}


def bench_tmux(n: int) -> dict[str, dict] | str:
    """OpenHands-style loop: send-keys, then capture-pane every 0.5 s until the marker shows."""
    if shutil.which("tmux") is None:
        return "tmux not installed"
    name = f"raasbench{uuid.uuid4().hex[:6]}"
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "250", "-y", "50", "bash --norc"], check=True)
    samples = []
    try:
        for i in range(n):
            marker = f"__DONE_{i}__"
            begin = time.perf_counter()
            subprocess.run(
                ["tmux", "send-keys", "-t", name, f"echo hi; echo __DONE_{{}}__ | sed s/{{}}/{i}/", "Enter"], check=True
            )
            while True:
                time.sleep(0.5)
                pane = subprocess.run(["tmux", "capture-pane", "-p", "-t", name], capture_output=True, text=True).stdout
                if f"\n{marker}" in pane:
                    break
            samples.append(time.perf_counter() - begin)
            subprocess.run(["tmux", "clear-history", "-t", name])
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name])
    return {"bash_echo": percentiles(samples)}


def table(results: dict) -> str:
    """Human-readable rows: system, operation, n, p50, p99."""
    rows = [f"{'system':<14} {'operation':<12} {'n':>5} {'p50 ms':>10} {'p99 ms':>10}"]
    for system, ops in results["systems"].items():
        if isinstance(ops, str):
            rows.append(f"{system:<14} {'(skipped)':<12} {ops}")
            continue
        for op, stats in ops.items():
            rows.append(f"{system:<14} {op:<12} {stats['n']:>5} {stats['p50_ms']:>10.3f} {stats['p99_ms']:>10.3f}")
    rows.append("")
    rows += [f"{key}: {value}" for key, value in results["summary"].items()]
    return "\n".join(rows)


def summarize(systems: dict) -> dict:
    """Speedups and goal checks."""
    bw = systems["raas-bwrap"]
    out = {
        "bash_p50_ms": bw["bash_echo"]["p50_ms"],
        "python_p50_ms": bw["python_1+1"]["p50_ms"],
        "bwrap_start_p50_ms": bw["start"]["p50_ms"],
    }
    for base in ("swe-rex", "tmux-0.5s"):
        if isinstance(systems.get(base), dict):
            out[f"speedup_vs_{base}"] = round(systems[base]["bash_echo"]["p50_ms"] / out["bash_p50_ms"], 1)
    checks = {
        "bash_p50_ms": out["bash_p50_ms"] <= GOALS["bash_p50_ms"],
        "python_p50_ms": out["python_p50_ms"] <= GOALS["python_p50_ms"],
        "bwrap_start_p50_ms": out["bwrap_start_p50_ms"] <= GOALS["bwrap_start_p50_ms"],
    }
    if "speedup_vs_swe-rex" in out:
        checks["speedup_vs_swerex"] = out["speedup_vs_swe-rex"] >= GOALS["speedup_vs_swerex"]
    out["goals_met"] = checks
    return out


def main() -> None:
    """Parse flags, run every system in this one process tree, print table + JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="round trips per operation")
    parser.add_argument("--starts", type=int, default=30, help="sandbox start/stop cycles")
    parser.add_argument("--swerex-n", type=int, default=200, help="SWE-ReX round trips")
    parser.add_argument("--tmux-n", type=int, default=10, help="tmux polling round trips")
    parser.add_argument("--swerex-python", default=str(ROOT / ".venv-bench" / "bin" / "python"))
    parser.add_argument("--json-out", default=None)
    parser.add_argument("--swerex-worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.swerex_worker is not None:
        swerex_worker(args.swerex_worker)
        return
    workspace = tempfile.mkdtemp(prefix="raas-bench-")
    systems = {
        "raas-bwrap": bench_raas("bwrap", args.n, args.starts, workspace),
        "raas-local": bench_raas("local", args.n, max(5, args.starts // 3), workspace),
        "swe-rex": bench_swerex(args.swerex_python, args.swerex_n),
        "tmux-0.5s": bench_tmux(args.tmux_n),
    }
    shutil.rmtree(workspace, ignore_errors=True)
    results = {
        "machine": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "python": platform.python_version(),
            "euid": os.geteuid(),
        },
        "systems": systems,
        "summary": summarize(systems),
    }
    print(table(results))
    print(json.dumps(results, indent=1))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
