"""Capacity of one PostgreSQL + one Redis: connections per node, operations per rollout, cost
per operation, and the model built from them. Prints JSON + tables.

(a) Connections: simulated nodes (each its own INIT/RUN/EVAL worker processes on this machine),
    sleep-bound stages (INIT 1 s, RUN 2 s in 2 turns, EVAL 1 s), on a private PostgreSQL with
    `max_connections` 100 (the machine's own setting) and the machine's Redis. Peak
    connections (pg_stat_activity sampled every 20 ms), rollouts/s, failures and `too many
    clients` lines, for 1/2/4 nodes of 2/4/2 slots and for 4 nodes of 8/16/8 slots, with the
    pool before issue 16 (SQLAlchemy's 10 + 20 overflow per process: up to one connection
    per busy slot) as the baseline against the pool now (`db_pool_size` 4), same run.
(b) Operations per rollout, per stage: SQL statements, commits, broker publishes and acks,
    counted inside every worker (bench/capacity_probe.py), from the runs of (a) and from a
    run with more turns (the per-turn cost is the difference).
(c) Cost per operation on this machine: PostgreSQL statement and commit latency (one
    client, the machine's server: fsync on) and throughput (pgbench, 8 clients); Redis round
    trip and throughput (redis-benchmark against a private redis-server).
(d) The model: what one PostgreSQL and one Redis sustain (rollouts/s, turns/s, concurrent
    slots for a rollout length), which limit is hit first, checked against (a).

Usage: .venv/bin/python bench/capacity.py [--quick] [--only connections|costs]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg
import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import capacity_probe as probe  # noqa: E402
from bench.capacity_model import STAGES, cluster_rows, model, per_rollout  # noqa: E402
from bench.support.pipeline_harness import start_service  # noqa: E402
from bench.support.private_services import PrivatePostgres, PrivateRedis  # noqa: E402
from raas_client.models import JobView  # noqa: E402

MACHINE_PG = "postgresql://postgres@127.0.0.1:5432/test"
POOLS = {
    "before (10+20 per process)": {"db_pool_size": 10, "db_pool_overflow": 20},
    "after (pool 4 per process)": {"db_pool_size": 4, "db_pool_overflow": 0},
}
STAGE_S = {"init_s": 1.0, "run_s": 2.0, "eval_s": 1.0}
IDLE_WINDOW_S = 3.0


class ConnectionSampler:
    """Peak backends connected to one database, sampled every 20 ms (raw psycopg on the
    server's `postgres` database: neither counted nor seen by the probe)."""

    def __init__(self, dsn: str, database: str) -> None:
        self.dsn, self.database, self.peak = dsn, database, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.wait(0.02):
                n = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (self.database,)
                ).fetchone()[0]
                self.peak = max(self.peak, n)

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)


def steady_rate(finished: list[float]) -> float:
    """Rollouts/s between the first and last sixth of completions (fill and drain dropped)."""
    finished = sorted(finished)
    lo, hi = len(finished) // 6, len(finished) - len(finished) // 6
    return (hi - lo) / max(finished[hi - 1] - finished[lo - 1], 1e-9)


def redis_commands(url: str) -> int:
    """Commands the server has run since its last stats reset."""
    import redis

    client = redis.Redis.from_url(url)
    stats = client.info("commandstats")
    client.close()
    return sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_info", "cmdstat_config"))


def reset_redis(url: str) -> None:
    """Empty the private broker and zero its command counters between runs."""
    import redis

    client = redis.Redis.from_url(url)
    client.flushall()
    client.config_resetstat()
    client.close()


def node_run(
    pg: PrivatePostgres,
    broker: PrivateRedis,
    pool: dict,
    nodes: int,
    slots: dict[str, int],
    n: int,
    turns: int = 2,
    timeout: float = 300,
) -> dict:
    """One job of `n` sleep-bound rollouts on `nodes` simulated nodes; what it cost."""
    db = f"cap_{uuid.uuid4().hex[:8]}"
    db_url = pg.create_database(db)
    reset_redis(broker.url)
    with tempfile.TemporaryDirectory() as home, tempfile.TemporaryDirectory() as counts:
        os.environ["CAPACITY_PROBE_DIR"] = counts  # the workers' environment, not ours
        with ConnectionSampler(pg.url().replace("+psycopg", ""), db) as sampler:
            svc = start_service(
                Path(home),
                db_url=db_url,
                broker_url=broker.url,
                nodes=tuple(f"n{k}" for k in range(nodes)),
                concurrency=slots,
                handler_modules="bench.capacity_probe",
                extra={**pool, "lease_timeout": 30.0},
            )
            try:
                wait_ready(svc, nodes)
                before = redis_commands(broker.url)  # idle polling: not the work's cost
                time.sleep(IDLE_WINDOW_S)
                idle_per_s = (redis_commands(broker.url) - before) / IDLE_WINDOW_S
                probe.reset()
                idle_commands = redis_commands(broker.url)
                t0 = time.monotonic()
                job = svc.client.submit(
                    "test-sleepy",
                    [{"instance_id": f"i{k}"} for k in range(n)],
                    agent_config={**STAGE_S, "turns": turns},
                )
                submit = probe.snapshot()
                view = wait_done(svc, job.job_id, timeout)
                wall = time.monotonic() - t0
                commands = redis_commands(broker.url) - idle_commands - idle_per_s * wall
                probe.reset()
                for _ in range(3):
                    try:
                        svc._reaper.run_once()
                    except sa.exc.OperationalError:  # a saturated baseline
                        pass
                reaper_pass = {k: v / 3 for k, v in probe.snapshot().get("other", {}).items()}
                logs = svc.log_tail(lines=1_000_000)
            finally:
                svc.stop()
        from core.db import dispose_all

        dispose_all(close=True)
        finished = finish_seconds(db_url, job.job_id)
        workers = probe.collect(Path(counts))
    per_node = min(
        slots["init"] / STAGE_S["init_s"], slots["run"] / STAGE_S["run_s"], slots["eval"] / STAGE_S["eval_s"]
    )
    result = {
        "pool": pool,
        "nodes": nodes,
        "slots": slots,
        "rollouts": n,
        "turns": turns,
        "done": view.counts.get("done", 0),
        "outcomes": view.outcomes,
        "too_many_clients_lines": logs.count("too many clients"),
        "peak_connections": sampler.peak,
        "wall_s": round(wall, 2),
        "steady_rollouts_per_s": round(steady_rate(finished), 3) if len(finished) >= 6 else None,
        "bound_per_s": per_node * nodes,
        "submit_ops": submit.get("other", {}),
        "reaper_pass_ops": reaper_pass,
        "redis_commands": round(commands),
        "redis_idle_commands_per_s": round(idle_per_s, 1),
        "worker_ops": {k: dict(v) for k, v in workers.items()},
    }
    print(json.dumps({k: v for k, v in result.items() if k != "worker_ops"}, default=str), file=sys.stderr)
    return result


def wait_ready(svc, nodes: int, timeout: float = 120) -> None:
    """Until every pool logged that it is ready (start-up is not the work's cost)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = sum(p.read_text(errors="replace").count("pool ready") for p in svc.logs.glob("*.log"))
        if ready >= 3 * nodes:
            return
        time.sleep(0.2)
    raise TimeoutError("worker pools did not start")


def wait_done(svc, job_id: str, timeout: float) -> JobView:
    """The job view once every rollout is terminal, or at `timeout` (a failed baseline)."""
    deadline = time.monotonic() + timeout
    view = None
    while True:
        view = job_view(svc, job_id) or view
        done = view is not None and view.finished >= view.n_rollouts
        if (done or time.monotonic() > deadline) and view is not None:
            return view
        time.sleep(0.25)


def finish_seconds(db_url: str, job_id: str) -> list[float]:
    """Seconds from the job's creation to each rollout's end (read once the service is
    stopped: a baseline run may still hold every connection the server allows)."""
    engine = sa.create_engine(db_url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        rows = (
            conn.execute(
                sa.text(
                    "SELECT extract(epoch FROM r.finished_at - j.created_at) FROM rollouts r "
                    "JOIN jobs j ON j.id = r.job_id WHERE r.job_id = :j AND r.finished_at IS NOT NULL"
                ),
                {"j": job_id},
            )
            .scalars()
            .all()
        )
    engine.dispose()
    return [float(x) for x in rows]


def job_view(svc, job_id: str) -> JobView | None:
    """The job view, or None while the gateway cannot reach the database."""
    try:
        return svc.client.job(job_id)
    except Exception:  # noqa: BLE001 - a saturated baseline answers 500s; keep polling
        return None


def pg_costs(seconds: int) -> dict:
    """PostgreSQL on the machine's server (fsync on): one client's latency, 8 clients'
    throughput (pgbench) for a primary-key read and a one-row update (one commit)."""
    db = f"cap_cost_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(MACHINE_PG, autocommit=True)
    admin.execute(f'CREATE DATABASE "{db}"')
    dsn = MACHINE_PG.rsplit("/", 1)[0] + f"/{db}"
    try:
        with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
            conn.execute("CREATE TABLE cap (id int PRIMARY KEY, n int NOT NULL DEFAULT 0, payload text)")
            conn.execute("INSERT INTO cap (id) SELECT g FROM generate_series(1, 10000) g")
            read = _latency(lambda k: conn.execute("SELECT n FROM cap WHERE id = %s", (k % 10000 + 1,)).fetchone())
            write = _latency(lambda k: conn.execute("UPDATE cap SET n = n + 1 WHERE id = %s", (k % 10000 + 1,)))
        scripts = {
            "read": "\\set id random(1, 10000)\nSELECT n FROM cap WHERE id = :id;\n",
            "write": "\\set id random(1, 10000)\nUPDATE cap SET n = n + 1 WHERE id = :id;\n",
        }
        tps = {name: _pgbench(db, script, seconds) for name, script in scripts.items()}
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        admin.close()
    return {
        "read_latency_ms": read,
        "commit_latency_ms": write,
        "read_per_s": tps["read"],
        "commits_per_s": tps["write"],
    }


def _latency(op, n: int = 2000) -> float:
    """Median milliseconds of `op(k)` over n calls."""
    times = []
    for k in range(n):
        t = time.perf_counter()
        op(k)
        times.append(time.perf_counter() - t)
    return round(sorted(times)[n // 2] * 1000, 3)


def _pgbench(db: str, script: str, seconds: int) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as f:
        f.write(script)
        f.flush()
        out = subprocess.run(
            [
                "pgbench",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-n",
                "-M",
                "simple",
                "-c",
                "8",
                "-j",
                "2",
                "-T",
                str(seconds),
                "-f",
                f.name,
                db,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    return round(float(re.search(r"tps = ([\d.]+)", out).group(1)), 1)


def redis_costs() -> dict:
    """Redis on a private server: one client's round trip, 50 clients' throughput."""
    import redis

    server = PrivateRedis()
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        rtt = _latency(lambda k: client.lpush("q", k))
        out = subprocess.run(
            ["redis-benchmark", "-p", str(server.port), "-t", "lpush,rpop", "-n", "200000", "-c", "50", "-q"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rates = {
            m.group(1).lower(): float(m.group(2)) for m in re.finditer(r"(\w+): ([\d.]+) requests per second", out)
        }
        client.close()
    finally:
        server.close()
    return {"round_trip_ms": rtt, "ops_per_s": round(min(rates.values()), 0), "by_op": rates}


def load() -> float:
    """The one-minute load average (this machine is shared: read figures against it)."""
    return os.getloadavg()[0]


def connection_runs(quick: bool) -> list[dict]:
    """(a)+(b): before/after pools on 1/2/4 nodes of 2/4/2 slots and 4 nodes of 8/16/8,
    and one run with more turns (the per-turn counts)."""
    pg, broker = PrivatePostgres(max_connections=100), PrivateRedis()
    pg.start()
    broker.start()
    small, big = {"init": 2, "run": 4, "eval": 2}, {"init": 8, "run": 16, "eval": 8}
    per_node = 12 if quick else 24
    runs = []
    try:
        for label, pool in POOLS.items():
            for nodes in (1, 2, 4):
                runs.append({"label": label, **node_run(pg, broker, pool, nodes, small, per_node * nodes)})
                print(f"# {label}: {nodes} nodes done (load {load():.1f})", file=sys.stderr)
            runs.append({"label": label, **node_run(pg, broker, pool, 4, big, 96 if quick else 256)})
            print(f"# {label}: 4 x 8/16/8 done (load {load():.1f})", file=sys.stderr)
        runs.append(
            {
                "label": "after, 8 turns",
                **node_run(pg, broker, POOLS["after (pool 4 per process)"], 1, small, per_node, turns=8),
            }
        )
    finally:
        from core.db import dispose_all

        dispose_all(close=True)
        pg.close()
        broker.close()
    return runs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller jobs")
    parser.add_argument("--only", choices=["connections", "costs"], default=None)
    args = parser.parse_args()
    report: dict = {"load_start": load()}
    if args.only in (None, "costs"):
        report["postgresql"] = pg_costs(3 if args.quick else 5)
        report["redis"] = redis_costs()
    if args.only in (None, "connections"):
        report["runs"] = connection_runs(args.quick)
    if args.only is None:
        after = [r for r in report["runs"] if r["label"].startswith("after (")]
        base = next(r for r in after if r["nodes"] == 1)
        more = next(r for r in report["runs"] if r["label"] == "after, 8 turns")
        m = report["model"] = model(base, more, report["postgresql"], report["redis"])
        report["cluster"] = [cluster_rows(m, s, t, 64) for s, t in ((20, 4), (60, 16))]
    report["load_end"] = load()
    print(json.dumps(report, indent=2, default=str))
    print_tables(report)


def print_tables(report: dict) -> None:
    """The tables BENCHMARKS.md quotes."""
    if "runs" in report:
        print(
            "\n| pool | nodes x slots | rollouts | done | failed | too many clients | peak conns "
            "| steady/s | bound/s | wall s |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in report["runs"]:
            slots = "/".join(str(r["slots"][s]) for s in STAGES)
            failed = r["rollouts"] - r["done"]
            print(
                f"| {r['label']} | {r['nodes']} x {slots} | {r['rollouts']} | {r['done']} | "
                f"{failed} | {r['too_many_clients_lines']} | {r['peak_connections']} | "
                f"{r['steady_rollouts_per_s']} | {r['bound_per_s']} | {r['wall_s']} |"
            )
        print("\n| run | stage | statements | commits | publishes | acks (per rollout) |")
        print("| --- | --- | --- | --- | --- | --- |")
        for r in report["runs"]:
            if not r["label"].startswith("after"):
                continue
            for stage, c in sorted(per_rollout(r).items()):
                print(
                    f"| {r['nodes']} node(s), {r['turns']} turns | {stage} | "
                    f"{c.get('statements', 0)} | {c.get('commits', 0)} | "
                    f"{c.get('publishes', 0)} | {c.get('acks', 0)} |"
                )
    if "postgresql" in report:
        p, r = report["postgresql"], report["redis"]
        print(
            f"\nPostgreSQL: read {p['read_latency_ms']} ms, commit {p['commit_latency_ms']} ms "
            f"(one client); {p['read_per_s']} reads/s, {p['commits_per_s']} commits/s "
            f"(pgbench, 8 clients). Redis: {r['round_trip_ms']} ms round trip, "
            f"{r['ops_per_s']} ops/s (redis-benchmark, 50 clients)."
        )
    if "model" in report:
        print(
            "\n| turns | statements | commits | broker cmds | PG rollouts/s | Redis rollouts/s "
            "| rollouts/s | turns/s | first limit |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in report["model"]["by_turns"]:
            print(
                f"| {r['turns']} | {r['statements']} | {r['commits']} | {r['broker_commands']} "
                f"| {r['postgres_rollouts_per_s']} | {r['redis_rollouts_per_s']} | "
                f"{r['rollouts_per_s']} | {r['turns_per_s']} | {r['first_limit']} |"
            )
        print(
            "\n| rollout | nodes (64 RUN slots) by PostgreSQL | by Redis | by max_connections "
            "100 (no PgBouncer) | slots |"
        )
        print("| --- | --- | --- | --- | --- |")
        for c in report["cluster"]:
            print(
                f"| {c['rollout_s']} s, {c['turns']} turns | {c['nodes_by_postgresql']} | "
                f"{c['nodes_by_redis']} | {c['nodes_by_connections']} | {c['slots_total']} |"
            )


if __name__ == "__main__":
    main()
