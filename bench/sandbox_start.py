"""Sandbox start: cold starts before/after, and claims from the warm pool, idle and under load.

Run (prints a table, then the JSON; about two minutes):
    .venv/bin/python bench/sandbox_start.py [--n 40] [--load 5] [--json-out FILE]

Every series runs in this one process, first at idle, then with `--load` busy processes
(`while True: pass`), so ratios compare like with like on a noisy machine (the two cold series
take their samples in turns):
- `cold, before`: a bwrap start as main made it (the tool server's modules compiled from source
  inside the sandbox at every start, `site` imported) -- the baseline;
- `cold`: a bwrap start now (bytecode precompiled on the host, no `site`);
- `pooled claim`: what INIT/EVAL wait for when the pool holds a sandbox of the shape (the pool
  refilled between samples, as when it keeps up with demand);
- `bare bwrap`: `bwrap ... true` with the same namespaces (the floor of any start).
Then where a cold start's time goes (`phases`, at idle; the launch is the process chain up to
the server's ready byte) and what the raw pieces cost (`pieces`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox import SandboxOptions, SandboxSettings, SandboxSpec, get_runtime  # noqa: E402
from sandbox import bwrap, node  # noqa: E402
from sandbox.inside import PTYPROCESS_DIR, TOOLSERVER_DIR, compile_server  # noqa: E402
from sandbox.pool import WarmPool, remove_slot  # noqa: E402

GOAL_P50_MS = 30.0


def pct(samples: list[float]) -> dict[str, float]:
    """n, p50, p90 (nearest rank) in milliseconds."""
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000  # noqa: E731
    return {"n": len(ordered), "p50_ms": round(pick(0.5), 2), "p90_ms": round(pick(0.9), 2)}


class Busy:
    """`n` processes spinning on the CPU while the block runs."""

    def __init__(self, n: int) -> None:
        self.n, self.procs = n, []

    def __enter__(self) -> Busy:
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.n)]
        time.sleep(0.5 if self.n else 0)
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def old_server_start() -> None:
    """The start as main made it: no bytecode on the host, `site` imported."""
    shutil.rmtree(Path(TOOLSERVER_DIR) / "__pycache__", ignore_errors=True)
    bwrap.compile_server = lambda *a, **k: False
    bwrap.SERVER_FLAGS = ("-I", "-B")


def new_server_start() -> None:
    """The start now (what this branch ships)."""
    bwrap.compile_server = compile_server
    bwrap.SERVER_FLAGS = ("-I", "-S", "-B")
    compile_server.cache_clear()
    assert compile_server(), "compileall failed"


def paired_cold_starts(runtime, workspace: str, n: int) -> tuple[list[float], list[float]]:
    """Cold starts before/now taken in turns (load that drifts hits both alike)."""
    before, now = [], []
    for _ in range(n):
        old_server_start()
        before += cold_starts(runtime, workspace, 1, warmup=0)
        new_server_start()
        now += cold_starts(runtime, workspace, 1, warmup=0)
    return before, now


def cold_starts(runtime, workspace: str, n: int, warmup: int = 2) -> list[float]:
    """Durations of `n` starts (each stopped untimed), after `warmup` untimed ones."""
    spec = SandboxSpec(workspace=workspace)
    samples = []
    for i in range(n + warmup):
        begin = time.perf_counter()
        sb = runtime.start(spec, label="bench:0")
        took = time.perf_counter() - begin
        sb.stop()
        if i >= warmup:
            samples.append(took)
    return samples


def pooled_claims(pool: WarmPool, n: int) -> tuple[list[float], int]:
    """Durations of `n` claims with the pool refilled before each; and the misses."""
    options, samples, misses = SandboxOptions(), [], 0
    for i in range(n + 2):
        assert pool.wait_ready(options, "bwrap", timeout=60), "the pool did not fill"
        begin = time.perf_counter()
        sb = pool.claim(options, "bwrap", f"bench:{i}")
        took = time.perf_counter() - begin
        if sb is None:
            misses += 1
            continue
        sb.stop()
        remove_slot(sb.workspace)
        if i >= 2:
            samples.append(took)
    return samples, misses


def bare_bwrap(n: int) -> list[float]:
    """`bwrap` with the sandbox's namespaces running `true`."""
    argv = [
        bwrap.bwrap_binary(),
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-net",
        "--ro-bind",
        "/usr",
        "/usr",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "/bin/true",
    ]
    samples = []
    for _ in range(n):
        begin = time.perf_counter()
        subprocess.run(argv, check=True)
        samples.append(time.perf_counter() - begin)
    return samples


def phases(runtime, workspace: str, n: int) -> dict[str, float]:
    """Median milliseconds of each step of a cold start (wrapped functions, nested: the
    launch contains the wait for the server)."""
    spent: dict[str, list[float]] = {}
    patched = []

    def timed(owner, name: str, key: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def inner(*args, **kwargs):
            begin = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent.setdefault(key, []).append(time.perf_counter() - begin)

        setattr(owner, name, inner)
        patched.append((owner, name, original))

    for owner, name, key in [
        (bwrap.BwrapRuntime, "new_handle", "intent record + socket dir"),
        (bwrap, "give_workspace", "workspace to the sandbox uid"),
        (bwrap.cgroups, "create", "cgroups (pids, memory)"),
        (bwrap.BwrapRuntime, "build_argv", "bwrap argv (mounts, limits)"),
        (bwrap, "gated_popen", "spawn the gated launcher"),
        (bwrap, "server_ready", "wait: launcher, bwrap, server up"),
        (bwrap, "pin_server", "pin the server (SO_PEERCRED)"),
        (bwrap.BwrapRuntime, "save", "ready record"),
    ]:
        timed(owner, name, key)
    try:
        total = cold_starts(runtime, workspace, n)
    finally:
        for owner, name, original in patched:
            setattr(owner, name, original)
    out = {key: round(statistics.median(v[-n:]) * 1000, 2) for key, v in spent.items()}
    out["total start"] = round(statistics.median(total) * 1000, 2)
    return out


def _run_pieces(argv: list[str], n: int) -> dict[str, float]:
    """Median wall ms and mean CPU ms (user + system, robust to a loaded machine) of a
    command run `n` times."""
    import resource

    samples = []
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(n):
        begin = time.perf_counter()
        subprocess.run(argv, check=True)
        samples.append(time.perf_counter() - begin)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime
    return {"wall_ms": round(statistics.median(samples) * 1000, 2), "cpu_ms": round(cpu / n * 1000, 2)}


def pieces(n: int = 10) -> dict[str, dict[str, float]]:
    """What the raw processes a start is made of cost (wall and CPU)."""
    boot = "import sys; sys.path[:0] = [{!r}, {!r}]; import toolserver.server".format(
        str(Path(TOOLSERVER_DIR).parent), str(Path(PTYPROCESS_DIR).parent)
    )
    runs = {
        "sh -c true (gate, cgroup join)": ["/bin/sh", "-c", "true"],
        "python3 -I -S (launch_as.py as root)": ["/usr/bin/python3", "-I", "-S", "-c", "pass"],
        "python3 -I (site)": ["/usr/bin/python3", "-I", "-c", "pass"],
        "server imports, precompiled, -S": ["/usr/bin/python3", "-I", "-S", "-B", "-c", boot],
    }
    out = {name: _run_pieces(argv, n) for name, argv in runs.items()}
    old_server_start()
    out["server imports, from source, site (before)"] = _run_pieces(["/usr/bin/python3", "-I", "-B", "-c", boot], n)
    new_server_start()
    return out


def run(n: int, load: int) -> dict:
    """Every series at idle and under load, the phases and pieces at idle."""
    state = tempfile.mkdtemp(prefix="raas-sbench-", dir="/tmp")
    work = Path(tempfile.mkdtemp(prefix="raas-sbench-ws-"))
    (work / "ws").mkdir()
    settings = SandboxSettings(state_dir=state)
    runtime = get_runtime("bwrap", settings)
    pool = WarmPool(settings, work / "slots", size=2)
    result: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "root": os.geteuid() == 0,
            "loadavg_start": os.getloadavg(),
        },
        "series": {},
    }
    try:
        for label, busy in (("idle", 0), (f"load {load}", load)):
            with Busy(busy):
                cold_starts(runtime, str(work / "ws"), 2)  # warm-up
                before, now = paired_cold_starts(runtime, str(work / "ws"), n)
                series = {"cold, before": pct(before), "cold": pct(now)}
                claims, misses = pooled_claims(pool, n)
                series["pooled claim"] = {**pct(claims), "misses": misses}
                series["bare bwrap"] = pct(bare_bwrap(n))
            result["series"][label] = series
        result["phases_before_ms"] = (old_server_start(), phases(runtime, str(work / "ws"), n))[1]
        new_server_start()
        result["phases_ms"] = phases(runtime, str(work / "ws"), n)
        result["pieces_ms"] = pieces()
    finally:
        pool.close()
        new_server_start()
        for handle in node.list_sandboxes(state, include_dead=True):
            node.stop_handle(handle)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)
    idle = result["series"]["idle"]
    result["goal"] = {
        "p50_ms_at_most": GOAL_P50_MS,
        "pooled_p50_ms": idle["pooled claim"]["p50_ms"],
        "met": idle["pooled claim"]["p50_ms"] <= GOAL_P50_MS,
    }
    result["machine"]["loadavg_end"] = os.getloadavg()
    return result


def table(result: dict) -> str:
    """The series as a markdown table, ratios against `cold, before` of the same load."""
    lines = ["| load | path | n | p50 ms | p90 ms | p50 vs cold before |", "| --- | --- | ---: | ---: | ---: | ---: |"]
    for load, series in result["series"].items():
        base = series["cold, before"]["p50_ms"]
        for name, row in series.items():
            extra = f" ({row['misses']} misses)" if row.get("misses") else ""
            lines.append(
                f"| {load} | {name}{extra} | {row['n']} | {row['p50_ms']} | "
                f"{row['p90_ms']} | {row['p50_ms'] / base:.2f} |"
            )
    lines += ["", "| cold start phase (idle) | before ms | now ms |", "| --- | ---: | ---: |"]
    for key, value in result["phases_ms"].items():
        lines.append(f"| {key} | {result['phases_before_ms'].get(key, '')} | {value} |")
    lines += ["", "| piece | wall ms | CPU ms |", "| --- | ---: | ---: |"]
    lines += [f"| {key} | {v['wall_ms']} | {v['cpu_ms']} |" for key, v in result["pieces_ms"].items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40, help="samples per series")
    parser.add_argument("--load", type=int, default=5, help="busy processes for the load series")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    if bwrap.BwrapRuntime.unavailable_reason():
        sys.exit(f"bwrap unusable here: {bwrap.BwrapRuntime.unavailable_reason()}")
    result = run(args.n, args.load)
    print(table(result))
    print(json.dumps(result, indent=1))
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
