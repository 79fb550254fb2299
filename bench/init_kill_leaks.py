"""SIGKILLed INIT workers mid-start: sandboxes and folders left behind once the reaper passed.

One node (INIT pool of 1 slot, RUN and EVAL pools, its reaper; shared Redis with a key prefix
and a fresh PostgreSQL database; its own sandbox state dir). `--kills` times: a one-rollout
`test-sandboxed` job is submitted, the INIT pool is SIGKILLed a delay after a host process
whose command line names the rollout's workspace appears (bwrap launched); the delays sweep
0..`--spread` seconds over the kills, so the kills land all over the sandbox's start (before
the tool server is ready, after it, around the handle write and the database save). The pool
is restarted; the rollout finishes as a new attempt. After the last job and a few
reaper passes, counted: live processes whose command line names a workspace of this service,
handle files in the state dir, rollout workspace folders left.

The baseline is the code tree given by `--baseline`, run by the same script in the same
invocation; "new" is this tree.

Usage: .venv/bin/python bench/init_kill_leaks.py --baseline /path/to/old/tree [--kills 6]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
REDIS = "redis://127.0.0.1:6379/0"


def _processes_naming(text: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        found.append(int(name))
            except OSError:
                pass
    return found


def measure(kills: int, spread: float) -> dict:
    """`kills` INIT kills mid-start in the tree on sys.path (a child process)."""
    import sqlalchemy as sa

    from bench.support.pipeline_harness import start_service, wait_for

    db = f"raas_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{db}"'))
    home = Path(tempfile.mkdtemp(prefix="raas-bench-initkill-"))
    state = home / "sandboxes"
    svc = start_service(
        home,
        db_url=sa.engine.make_url(PG_ADMIN).set(database=db).render_as_string(hide_password=False),
        broker_url=REDIS,
        key_prefix=f"raas-bench-{uuid.uuid4().hex[:8]}:",
        concurrency={"init": 1, "run": 2, "eval": 2},
        extra={"sandbox_dir": str(state)},
    )
    root = str(svc.settings.workspaces)
    hits = 0
    try:
        for k in range(kills):
            job = svc.client.submit("test-sandboxed", [{"instance_id": "a"}])
            workspace = f"{root}/{job.rollout_ids[0]}-1"
            wait_for(
                lambda workspace=workspace: _processes_naming(workspace),
                120,
                "INIT launching a sandbox",
                interval=0.002,
            )
            time.sleep(spread * k / max(kills - 1, 1))
            svc.kill_worker("init", "node-a")
            hits += 1
            svc.start_worker("init", "node-a", 1)
            svc.wait_done(job.job_id, timeout=180)
        time.sleep(3 * svc.settings.reaper_interval + svc.settings.lease_timeout)
        processes = _processes_naming(root + "/")
        handles = [p for p in os.listdir(state) if p.endswith(".json")] if state.exists() else []
        folders = os.listdir(root) if os.path.isdir(root) else []
        return {
            "kills": hits,
            "leaked_processes": len(processes),
            "leaked_handle_files": len(handles),
            "leaked_folders": len(folders),
        }
    finally:
        svc.stop()
        for pid in _processes_naming(root + "/"):  # what the service leaked: not ours to keep
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        from core.db import dispose_all

        dispose_all(close=True)
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))


def main() -> None:
    """Baseline tree and this tree; JSON lines then a table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", type=Path, help="code tree to compare against")
    parser.add_argument("--kills", type=int, default=6)
    parser.add_argument("--spread", type=float, default=0.6)
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.kills, args.spread)))
        return
    results = []
    for name, tree in ([("baseline", args.baseline)] if args.baseline else []) + [("new", HERE)]:
        out = subprocess.run(
            [sys.executable, __file__, "--child", "--kills", str(args.kills), "--spread", str(args.spread)],
            env={**os.environ, "PYTHONPATH": str(tree.resolve())},
            cwd=tree,
            text=True,
            stdout=subprocess.PIPE,
            timeout=1800,
        )
        results.append({"code": name, **json.loads(out.stdout.strip().splitlines()[-1])})
        print(json.dumps(results[-1]), flush=True)
    print(f"\n{'code':9} {'INIT kills':>10} {'live processes':>15} {'handle files':>13} {'folders':>8}")
    for r in results:
        print(
            f"{r['code']:9} {r['kills']:>10} {r['leaked_processes']:>15} "
            f"{r['leaked_handle_files']:>13} {r['leaked_folders']:>8}"
        )


if __name__ == "__main__":
    main()
