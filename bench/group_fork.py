"""INIT of a GRPO group: n samples each checking out the repository (today) vs one prepared
layer forked copy-on-write by every sample (issue 38).

Run (prints a table, then the JSON; about a minute):
    .venv/bin/python bench/group_fork.py [--files 4000] [--n 8] [--workers 4] [--repeat 1] [--json-out FILE]

A real repository of `--files` generated source files (a git repo with history, served from a
repository mirror as a `owner__name.git` bare repo, as SWE-bench slugs are) is the instance.
The paths run in this one process, through the pipeline's own functions and the swe handler:
- `unforked` (the baseline, `sandbox.group_fork: false`): each sample's INIT starts its sandbox
  (`tasks.sandboxing.sandboxes.start`) and runs `SWEHandler.init` (clone + checkout at the base commit);
- `forked`: each sample's INIT goes through `tasks.sandboxing.group_layers.sample_sandbox` (a real SQLite
  `group_layers` row; the first sample prepares the layer, the others wait for it) and runs
  `SWEHandler.init_fork`; its sandbox is a fork slot the pool started while the layer was made;
- `forked, cold forks`: the same without fork slots (the path before them: each sample's fork is
  a bwrap start once its layer is there).
`--workers` INIT threads take the n samples, as an INIT pool's slots would. Each sample then
changes one file, so "disk per sample" is a checkout (unforked) vs its own change (forked).
CPU counts this process, its reaped children (git) and every sandbox's processes, warm-pool
members included (read from /proc just before each is stopped; the CPU of those reads, a walk
of all of /proc per sandbox, is the bench's and is left out; a sandbox whose bwrap this process
reaped is in its children's CPU too, and is taken off there). The CPU this process spends in
sandbox starts (on an INIT thread or the pool's filler) is the sandboxes' too, not the
instance's work. The warm pool runs as in a
worker (`--pool`, default 2 per shape; 0: every start cold) and is closed between groups, so
each group pays for the members started on its behalf.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.contexts import InitContext  # noqa: E402
from agents.handlers.swe.handler import SWEHandler  # noqa: E402
from agents.handlers.swe.repo import git  # noqa: E402
from agents.job_config import JobConfig  # noqa: E402
from core.db import session_scope  # noqa: E402
from core.models import Job  # noqa: E402
from core.settings import Settings  # noqa: E402
from migrations.runner import upgrade  # noqa: E402
from sandbox import list_sandboxes  # noqa: E402
from sandbox.toolserver.procs import descendants  # noqa: E402
from sandbox.workspace import disk_usage  # noqa: E402
from tasks.sandboxing import group_layers, sandboxes  # noqa: E402

SLUG = "bench/generated"
CLK = os.sysconf("SC_CLK_TCK")


def build_repo(mirror: Path, files: int) -> str:
    """A bare, packed repo `bench__generated.git` of `files` source files in nested packages,
    two commits deep; returns the base commit."""
    src = mirror.parent / "src"
    for i in range(files):
        path = src / f"pkg{i % 40}" / f"sub{i % 7}" / f"mod{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        body = "".join(f"def f{i}_{k}(x):\n    return x * {k} + {i}\n\n" for k in range(40))
        path.write_text(f'"""Module {i}."""\n\n{body}')
    git(src, "init", "-q", "-b", "main")
    git(src, "add", "-A")
    git(src, "commit", "-q", "--no-gpg-sign", "-m", "base")
    base = git(src, "rev-parse", "HEAD").strip()
    (src / "pkg0" / "later.py").write_text("LATER = 1\n")
    git(src, "add", "-A")
    git(src, "commit", "-q", "--no-gpg-sign", "-m", "later")
    bare = mirror / "bench__generated.git"
    git(mirror.parent, "clone", "-q", "--bare", str(src), str(bare))
    # packed, as a fetched mirror is: each checkout's gc then reuses the pack's deltas instead
    # of compressing 8,000 loose objects anew (9 s of CPU per checkout here, or 3 s after git's
    # own background gc happened to pack the mirror: a bimodal baseline)
    git(bare, "gc", "-q")
    return base


def tree_cpu(pids: set[int]) -> float:
    """CPU seconds (user + system, with reaped children) of these processes and their
    descendants, from /proc."""
    total, seen = 0.0, set()
    for pid in list(pids):
        for p in {pid, *descendants(pid)}:
            if p in seen:
                continue
            seen.add(p)
            try:
                fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += sum(int(fields[k]) for k in (11, 12, 13, 14)) / CLK
    return total


def own_cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class CpuMeter:
    """CPU of every sandbox a group started, each read just before it is stopped."""

    def __init__(self) -> None:
        self.by_sandbox: dict[str, float] = {}
        self.pids: dict[str, int] = {}  # the sandbox's bwrap: a child of this process
        self.overhead = 0.0  # this process's CPU spent reading /proc here: the bench's, not INIT's
        self.starting = 0.0  # this process's CPU in sandbox starts (`_meter_starts`)
        self.lock = threading.Lock()

    def snap(self, handle: dict | None) -> None:
        if handle and handle.get("pid"):
            t0 = time.thread_time()
            cpu = tree_cpu({handle["pid"]})  # walks all of /proc per sandbox
            with self.lock:
                self.by_sandbox[handle["id"]] = max(cpu, self.by_sandbox.get(handle["id"], 0.0))
                self.pids[handle["id"]] = handle["pid"]
                self.overhead += time.thread_time() - t0

    def wrap(self, module, name: str) -> None:
        real = getattr(module, name)

        def snapped(handle, *args, **kwargs):
            self.snap(handle)
            return real(handle, *args, **kwargs)

        setattr(module, name, snapped)

    def total(self) -> float:
        return sum(self.by_sandbox.values())

    def reaped(self) -> float:
        """CPU of the metered sandboxes whose bwrap this process has reaped (reaping those
        that exited): the kernel added it to this process's children's CPU too, so it is
        taken off there and counted once, in `total`."""
        gone = 0.0
        for sid, pid in self.pids.items():
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue  # still running: not in the children's CPU
            except ChildProcessError:
                pass  # reaped already (by subprocess' cleanup)
            gone += self.by_sandbox[sid]
        return gone


METER = CpuMeter()
for _module, _name in ((sandboxes, "stop"), (sandboxes, "release")):
    METER.wrap(_module, _name)


def _meter_starts() -> None:
    """The CPU this process spends starting sandboxes (the launcher's spawn, handle writes,
    the tool server's compile check), on whichever thread starts them (an INIT's, the warm
    pool's filler): the sandboxes' cost, counted with them, not as the instance's work."""
    from sandbox.bwrap import BwrapRuntime

    real = BwrapRuntime.start

    def start(self, *args, **kwargs):
        t0 = time.thread_time()
        try:
            return real(self, *args, **kwargs)
        finally:
            with METER.lock:
                METER.starting += time.thread_time() - t0

    BwrapRuntime.start = start


_meter_starts()


class Group:
    """One group's INIT on one path; records per-sample figures."""

    def __init__(self, settings: Settings, job_id: str, instance: dict, forked: bool, n: int) -> None:
        self.settings, self.job_id, self.instance, self.forked, self.n = settings, job_id, instance, forked, n
        self.handler = SWEHandler()
        self.config = JobConfig.load({"sandbox": {"group_fork": forked}})
        self.agent_config = self.handler.load_config({}, settings)
        self.handles: list[dict] = []
        self.starts: list[float] = []  # seconds from "the layer is there" to a ready sandbox
        self.lock = threading.Lock()

    def ctx(self, k: int) -> InitContext:
        return InitContext(
            rollout_id=f"{self.job_id[:24]}{k:08x}",
            job_id=self.job_id,
            instance_id="bench-1",
            instance=self.instance,
            sample_index=k,
            attempt=1,
            agent_config=self.agent_config,
            job_config=self.config,
            settings=self.settings,
            deadline=time.monotonic() + 600,
        )

    def sample(self, k: int) -> None:
        ctx = self.ctx(k)
        options = sandboxes.merged_options(self.config.sandbox, self.handler.sandbox_overrides(ctx))
        if self.forked:
            sb, handle = group_layers.sample_sandbox(
                self.settings, self.handler, ctx, self.job_id, options, "bwrap", 1, self.n
            )
            started = handle["fork_seconds"]
            ctx = ctx.with_sandbox(sb, handle["workspace"])
            self.handler.init_fork(ctx)
        else:
            t0 = time.monotonic()
            sb, handle = sandboxes.start(self.settings, options, ctx.rollout_id, 1, "bwrap")
            started = time.monotonic() - t0
            ctx = ctx.with_sandbox(sb, handle["workspace"])
            self.handler.init(ctx)
        sandboxes.hand_over(handle)
        with self.lock:
            self.handles.append(handle)
            self.starts.append(started)

    def run(self, workers: int) -> dict:
        METER.by_sandbox.clear()
        METER.pids.clear()
        cpu0, t0, overhead0, starting0 = own_cpu(), time.monotonic(), METER.overhead, METER.starting
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(self.sample, range(self.n)))
        wall = time.monotonic() - t0
        for handle in list_sandboxes(self.settings.sandbox_dir, include_dead=True):
            METER.snap(handle)  # the group's and the pool members started on its behalf
        sandboxes.close_warm_pools()
        processes = METER.total()
        counted_twice = METER.reaped()
        cpu = own_cpu() - cpu0 - counted_twice - (METER.overhead - overhead0) + processes
        sandbox_cpu = processes + (METER.starting - starting0)  # their processes and their starts
        for h in self.handles:  # the agent's work: one file changed per sample
            sb = sandboxes.attach(self.settings, h)
            assert sb.bash("echo '# changed' >> pkg1/sub1/mod1.py").exit_code == 0
        disk = [disk_usage(h["workspace"])[0] for h in self.handles]
        for h in self.handles:
            sandboxes.release(h)
        return {
            "init_wall_s": round(wall, 3),
            "init_cpu_s": round(cpu, 3),
            # the instance's own work (checkouts, the layer, this process) vs the sandboxes'
            # (their processes, and this process's CPU starting them)
            "instance_cpu_s": round(cpu - sandbox_cpu, 3),
            "sandbox_cpu_s": round(sandbox_cpu, 3),
            "sandboxes_started": len(METER.by_sandbox),
            "disk_per_sample_kb": round(statistics.median(disk) / 1024, 1),
            "start_after_init_ms_p50": round(statistics.median(self.starts) * 1000, 1),
            "start_after_init_ms_max": round(max(self.starts) * 1000, 1),
        }


@contextlib.contextmanager
def no_fork_slots():
    """The pool without fork slots (as before them): forks of a layer start once it exists."""
    from sandbox.bwrap import BwrapRuntime

    real = BwrapRuntime.fork_slots_unavailable_reason
    BwrapRuntime.fork_slots_unavailable_reason = lambda self: "off for the bench's comparison"
    try:
        yield
    finally:
        BwrapRuntime.fork_slots_unavailable_reason = real


def one_sample(settings: Settings, job_id: str, instance: dict) -> dict:
    """One unforked sample's INIT alone (the unit the goal is stated in; the least CPU of
    three is reported, the kindest baseline for the forked group's ratio)."""
    # no pool: one cold start and one checkout, not the members a pool would start after it
    group = Group(settings.model_copy(update={"sandbox_pool_size": 0}), job_id, instance, False, 1)
    return group.run(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4000)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--pool", type=int, default=2, help="warm sandboxes per shape (0: all cold)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each group path (the least CPU is shown)")
    parser.add_argument("--json-out")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raas-bench-fork-") as tmp:
        home, mirror = Path(tmp) / "home", Path(tmp) / "mirror"
        mirror.mkdir(parents=True)
        base = build_repo(mirror, args.files)
        settings = Settings(home=home, repo_mirror_root=mirror, sandbox_pool_size=args.pool)
        upgrade(settings.db_url)
        instance = {"repo": SLUG, "base_commit": base}
        results, layer_cpu = {}, {}
        with session_scope(settings.db_url) as s:
            jobs = [Job(agent="swe", n_instances=1) for _ in range(1 + 3 * args.repeat)]
            s.add_all(jobs)
            s.flush()
            ids = [j.id for j in jobs]
        one_sample(settings, ids[0], instance)  # warm-up: builds the `pytest` environment once
        singles = [one_sample(settings, ids[0], instance) for _ in range(3)]
        results["one unforked sample"] = min(singles, key=lambda r: r["init_cpu_s"])
        least = {"unforked group": [], "forked group, cold forks": [], "forked group": []}
        for k in range(args.repeat):  # alternating, each group a job of its own (its own layer)
            least["unforked group"].append(Group(settings, ids[1 + 3 * k], instance, False, args.n).run(args.workers))
            with no_fork_slots():  # last round's forks: each started cold once its layer is there
                cold = Group(settings, ids[2 + 3 * k], instance, True, args.n).run(args.workers)
            least["forked group, cold forks"].append(cold)
            least["forked group"].append(Group(settings, ids[3 + 3 * k], instance, True, args.n).run(args.workers))
        for name, runs in least.items():  # the least CPU of the repeats, as for the baseline
            results[name] = min(runs, key=lambda r: r["init_cpu_s"])
            results[name]["start_after_init_ms_p50_all_runs"] = [r["start_after_init_ms_p50"] for r in runs]
        with session_scope(settings.db_url) as s:
            from core.models import GroupLayer

            layer = s.query(GroupLayer).filter(GroupLayer.job_id == ids[3]).one()
            layer_cpu = {"prepared_s": layer.prepared_seconds, "mode": layer.mode}
            files = int(
                subprocess.run(
                    ["git", "-C", str(mirror / "bench__generated.git"), "ls-tree", "-r", base, "--name-only"],
                    capture_output=True,
                    text=True,
                ).stdout.count("\n")
            )
        one, plain, forked = results["one unforked sample"], results["unforked group"], results["forked group"]
        summary = {
            "repo_files": files,
            "n": args.n,
            "workers": args.workers,
            "pool": args.pool,
            "repeat": args.repeat,
            "layer": layer_cpu,
            "forked_group_cpu_over_one_sample": round(forked["init_cpu_s"] / one["init_cpu_s"], 2),
            "forked_group_instance_cpu_over_one_sample": round(forked["instance_cpu_s"] / one["instance_cpu_s"], 2),
            "unforked_group_instance_cpu_over_one_sample": round(plain["instance_cpu_s"] / one["instance_cpu_s"], 2),
            "unforked_group_cpu_over_one_sample": round(plain["init_cpu_s"] / one["init_cpu_s"], 2),
            "forked_group_wall_over_unforked": round(forked["init_wall_s"] / plain["init_wall_s"], 2),
            "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "load": os.getloadavg()[0]},
        }
    print(
        "| path | INIT wall s | INIT CPU s | of it instance work | of it sandboxes (n) "
        "| disk/sample KB | start p50 ms | start max ms |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in results.items():
        print(
            f"| {name} | {r['init_wall_s']} | {r['init_cpu_s']} | {r['instance_cpu_s']} | "
            f"{r['sandbox_cpu_s']} ({r['sandboxes_started']}) | {r['disk_per_sample_kb']} | "
            f"{r['start_after_init_ms_p50']} | {r['start_after_init_ms_max']} |"
        )
    out = {"results": results, "summary": summary}
    print(json.dumps(out, indent=1))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
