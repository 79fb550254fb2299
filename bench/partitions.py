"""Partition schedules (issue 42): what each costs. Prints JSON + a table.

Runs tests/partitions' schedules on a partition campaign (two nodes whose links to private
PostgreSQL and Redis, and the gateway's to Redis, go through loopback proxies the run makes:
`bench.support.tcp_proxy`) and reports per schedule: rollouts, lost, duplicated, wrong rewards,
LLM calls generated again, new attempts, leaked sandboxes and workspaces, and the history
checker's violations (bench/support/partitions/checker.py). Goal: every column but the waste 0.

Usage: .venv/bin/python bench/partitions.py [--only n1-pg-cut-20s,...] [--json F]
(needs bwrap, redis-server and PostgreSQL 15 binaries; never touches the machine's services)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

COLUMNS = [
    ("rollouts", "rollouts"),
    ("lost", "lost"),
    ("duplicated", "dup"),
    ("wrong_rewards", "wrong"),
    ("regenerated_calls", "regenerated calls"),
    ("retried_rollouts", "new attempts"),
    ("leaked", "leaked"),
    ("violations", "violations"),
    ("seconds", "s"),
]


def run(only: list[str]) -> dict[str, dict]:
    """{schedule: figures} from one partition campaign."""
    from sandbox.environments import build_environment
    from bench.support.faults.campaign import Campaign
    from bench.support.partitions.schedules import SCHEDULES, warm_up

    env = Path(build_environment("math", ["sympy", "numpy"], root=REPO / ".raas" / "envs")).resolve()
    home = Path(tempfile.mkdtemp(prefix="raas-partitions-bench-"))
    campaign = Campaign(home, envs_math=env, links=True)
    out = {}
    try:
        warm_up(campaign)
        for name in only or list(SCHEDULES):
            report = campaign.run(SCHEDULES[name])
            figures = report.as_dict()
            figures["leaked"] = report.live_sandboxes_left + report.dirs_left
            figures["clean"] = not report.problems()
            out[name] = figures
            print(f"# {name}: {json.dumps(figures)}", file=sys.stderr, flush=True)
    finally:
        campaign.close()
        shutil.rmtree(home, ignore_errors=True)
    return out


def table(results: dict[str, dict]) -> str:
    """Markdown: one row per schedule."""
    lines = ["| schedule | " + " | ".join(label for _, label in COLUMNS) + " |", "|" + " --- |" * (len(COLUMNS) + 1)]
    for name, figures in results.items():
        lines.append(f"| {name} | " + " | ".join(str(figures.get(key, "-")) for key, _ in COLUMNS) + " |")
    return "\n".join(lines)


def main() -> None:
    """Parse options, run the schedules, print JSON and the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated schedule names")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    results = run([n for n in args.only.split(",") if n])
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(json.dumps(results))
    print(table(results))


if __name__ == "__main__":
    main()
