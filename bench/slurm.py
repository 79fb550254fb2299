"""What a Slurm `scancel`, time limit and `scontrol requeue` cost raas node jobs, on a real
(private, one-node) Slurm cluster: lost, duplicated, wrong rewards, re-runs from INIT.

    python bench/slurm.py                              # shipped node job, both proctracks
    python bench/slurm.py --layout readme --tree DIR   # the "before": README layout, DIR's code

`--tree DIR` runs the node jobs on another checkout's code (e.g. `git archive main | tar -x
-C DIR`). Needs root (it installs slurm-wlm and munge when missing) and the shared Redis and
PostgreSQL of this machine. Prints one JSON line per run, then a table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import uuid
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.support.services import PG_ADMIN_URL, REDIS_URL
from bench.support.slurm.cluster import SlurmCluster, available_proctracks
from bench.support.slurm.scenario import SlurmScenario, dump, shared_env_root

COLUMNS = (
    "proctrack",
    "layout",
    "fault",
    "rollouts",
    "completed",
    "wrong_rewards",
    "agent_errors",
    "lost",
    "duplicated",
    "rerun_from_init",
    "loops_regenerated",
    "turns_regenerated",
    "turns_regenerated_max",
    "replayed_turns",
    "tokens_regenerated",
    "in_run_at_strike",
    "orphans",
    "seconds",
)


def database() -> str:
    """A fresh database on the shared PostgreSQL."""
    name = f"raas_slurm_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return sa.engine.make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proctrack", default=",".join(available_proctracks()))
    parser.add_argument("--layout", default="shipped", choices=("shipped", "readme"))
    parser.add_argument("--faults", default="scancel,timelimit,requeue")
    parser.add_argument("--tree", default=None, help="Run the node jobs on this checkout")
    args = parser.parse_args()
    reports = []
    for proctrack in args.proctrack.split(","):
        cluster = SlurmCluster(proctrack).start()
        home = Path(tempfile.mkdtemp(prefix="raas-bench-slurm-"))
        scenario = SlurmScenario(home, cluster, database(), REDIS_URL, shared_env_root(home), pythonpath=args.tree)
        try:
            for fault in args.faults.split(","):
                report = scenario.run(fault, args.layout)
                print(dump(report), flush=True)
                reports.append(report)
        finally:
            scenario.close()
            cluster.stop()
    print(" | ".join(COLUMNS))
    for r in reports:
        print(" | ".join(str(getattr(r, c)) for c in COLUMNS))


if __name__ == "__main__":
    main()
