"""Fault campaign benchmark: what each fault of issue 15 costs. Prints JSON + a table.

Runs the fault campaign (two nodes on private Redis + PostgreSQL, a reaper per node,
4-turn scripted `math` rollouts in bwrap sandboxes, 6 s lease; see bench/support/faults/campaign.py)
once per fault and reports per fault: rollouts lost / duplicated / leaked (must be 0), LLM
calls re-generated (beyond 4 per rollout that ran its loop), rollouts re-run (their first turn
generated again), and for a killed RUN pool the answered turns re-generated per rollout it held
with finished turns (goal <= 1).

`--baseline COMMIT` also runs the same campaign on COMMIT in the same invocation: a temporary
git worktree of COMMIT with this checkout's campaign files laid over it (bench/support: the
campaign, the harness, the private services; the simulator's per-turn counters, this script), so before and
after are measured by the same code on the same machine.

Usage: .venv/bin/python bench/faults.py [--baseline 635fdca] [--only node-loss,...] [--json F]
       [--repeat 5]
(needs bwrap, redis-server and PostgreSQL 15 binaries; never touches the machine's services)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

OVERLAY = [
    "bench/__init__.py",
    "bench/support",
    "fakellm/server.py",
    "fakellm/capacity.py",
    "bench/faults.py",
]
COLUMNS = [
    ("finished", "finished"),
    ("infra_errors", "infra_error"),
    ("wrong_rewards", "wrong"),
    ("lost", "lost"),
    ("duplicated", "dup"),
    ("leaked", "leaked"),
    ("retried_rollouts", "new attempts"),
    ("rerun_rollouts", "re-run loops"),
    ("regenerated_calls", "re-generated LLM calls"),
    ("affected_regen_per_rollout", "per killed-RUN rollout"),
    ("affected_regenerated_max", "most by one"),
    ("replayed_turns", "replayed"),
    ("regenerated_tokens", "tokens generated again"),
    ("pools_exited", "pools exited"),
    ("seconds", "s"),
]


def run_here(only: list[str], envs_root: Path, repeat: int = 1) -> dict[str, dict]:
    """Run the campaign in this checkout; {fault: figures} (`fault#k` for the k-th of
    `repeat` runs)."""
    from sandbox.environments import build_environment
    from bench.support.faults.campaign import Campaign
    from bench.support.faults.faults import FAULTS

    env = Path(build_environment("math", ["sympy", "numpy"], root=envs_root)).resolve()
    home = Path(tempfile.mkdtemp(prefix="raas-faults-bench-"))
    campaign = Campaign(home, envs_math=env)
    out = {}
    try:
        runs = [(name, k) for name in only or list(FAULTS) for k in range(1, repeat + 1)]
        for name, k in runs:
            report = campaign.run(FAULTS[name])
            figures = report.as_dict()
            figures["leaked"] = report.live_sandboxes_left + report.dirs_left
            figures["infra_errors"] = report.outcomes.get("infra_error", 0)
            figures["affected_regen_per_rollout"] = (
                round(report.affected_regenerated / report.affected, 2)
                if name.startswith(("sigkill", "node-")) and report.affected
                else None
            )
            figures["clean"] = not report.problems()
            key = f"{name}#{k}" if repeat > 1 else name
            out[key] = figures
            print(f"# {key}: {json.dumps(figures)}", file=sys.stderr, flush=True)
    finally:
        campaign.close()
        shutil.rmtree(home, ignore_errors=True)
    return out


def run_baseline(commit: str, only: list[str], envs_root: Path, repeat: int = 1) -> dict[str, dict]:
    """The same campaign on `commit` (a throwaway worktree with the campaign laid over)."""
    tree = Path(tempfile.mkdtemp(prefix="raas-faults-base-")) / "repo"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), commit], check=True, capture_output=True
    )
    try:
        for rel in OVERLAY:
            src, dst = REPO / rel, tree / rel
            if src.is_dir():
                shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        result_file = tree / "faults.json"
        cmd = [
            sys.executable,
            str(tree / "bench" / "faults.py"),
            "--json",
            str(result_file),
            "--envs-root",
            str(envs_root),
            "--quiet",
        ]
        if only:
            cmd += ["--only", ",".join(only)]
        if repeat > 1:
            cmd += ["--repeat", str(repeat)]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        subprocess.run(cmd, cwd=tree, env=env, check=True)
        return json.loads(result_file.read_text())["current"]
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], capture_output=True)
        shutil.rmtree(tree.parent, ignore_errors=True)


def table(current: dict[str, dict], baseline: dict[str, dict] | None, commit: str) -> str:
    """Markdown table: one row per fault, `before -> after` where a baseline ran."""
    head = "| fault | " + " | ".join(label for _, label in COLUMNS) + " |"
    lines = [head, "|" + " --- |" * (len(COLUMNS) + 1)]
    for name, now in current.items():
        cells = []
        for key, _ in COLUMNS:
            after = _cell(now.get(key))
            before = _cell((baseline or {}).get(name, {}).get(key, "n/a")) if baseline else None
            cells.append(f"{before} -> {after}" if baseline else f"{after}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if baseline:
        lines.append(f"\n(before = {commit}, after = this checkout; same script, same run)")
    return "\n".join(lines)


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def main() -> None:
    """Parse options, run the campaign (and the baseline), print JSON and the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="also run the campaign on this commit")
    parser.add_argument("--only", default="", help="comma-separated fault names")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument(
        "--envs-root",
        type=Path,
        default=REPO / ".raas" / "envs",
        help="where the sandbox `math` environment is built (once)",
    )
    parser.add_argument("--quiet", action="store_true", help="no table (baseline child)")
    parser.add_argument("--repeat", type=int, default=1, help="run each fault this often")
    args = parser.parse_args()
    only = [n for n in args.only.split(",") if n]
    envs_root = args.envs_root.resolve()
    baseline = run_baseline(args.baseline, only, envs_root, args.repeat) if args.baseline else None
    current = run_here(only, envs_root, args.repeat)
    result = {"baseline_commit": args.baseline, "baseline": baseline, "current": current}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    if not args.quiet:
        print(table(current, baseline, args.baseline or ""))


if __name__ == "__main__":
    main()
