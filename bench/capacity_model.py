"""The capacity model of bench/capacity.py: from operations per rollout and per turn and the
cost of one operation, what one PostgreSQL + one Redis sustain and which limit comes first."""

from __future__ import annotations

STAGES = ("init", "run", "eval")


def per_rollout(run: dict) -> dict[str, dict[str, float]]:
    """Worker operations per finished rollout, per stage (and heartbeat / other)."""
    done = max(run["done"], 1)
    return {
        stage: {k: round(v / done, 2) for k, v in counts.items() if k != "task_seconds"}
        for stage, counts in run["worker_ops"].items()
    }


def stage_sum(ops: dict[str, dict[str, float]], key: str, stages: tuple[str, ...] = STAGES) -> float:
    """`key` summed over the stage tasks (heartbeat and idle work excluded)."""
    return sum(ops.get(s, {}).get(key, 0.0) for s in stages)


def model(
    base: dict,
    more_turns: dict,
    costs: dict,
    redis: dict,
    heartbeat_s: float = 2.0,
    reaper_s: float = 5.0,
    pool: int = 4,
    max_connections: int = 100,
) -> dict:
    """What one PostgreSQL + one Redis sustain, from counts per rollout and per turn and the
    cost of one operation. PostgreSQL time per rollout = statements x read cost + commits x
    (commit cost - read cost), every commit priced as a write (reads commit too: pessimistic).
    """
    a, b = per_rollout(base), per_rollout(more_turns)
    dturns = more_turns["turns"] - base["turns"]
    per_turn = {k: (stage_sum(b, k) - stage_sum(a, k)) / dturns for k in ("statements", "commits", "publishes", "acks")}
    fixed = {k: stage_sum(a, k) - base["turns"] * per_turn[k] for k in ("statements", "commits", "publishes", "acks")}
    redis_per_msg = base["redis_commands"] / max(stage_sum(a, "acks") * base["done"], 1)
    read_s, commit_s = 1 / costs["read_per_s"], 1 / costs["commits_per_s"]
    extra_commit_s = max(commit_s - read_s, 0.0)
    reaper = base["reaper_pass_ops"]
    node_pg_s = (3 / heartbeat_s) * (read_s + extra_commit_s) + (
        reaper.get("statements", 0) * read_s + reaper.get("commits", 0) * extra_commit_s
    ) / reaper_s  # per node per second, busy or not

    def rollouts_per_s(turns: int) -> dict:
        stmts = fixed["statements"] + turns * per_turn["statements"]
        commits = fixed["commits"] + turns * per_turn["commits"]
        msgs = fixed["acks"] + turns * per_turn["acks"]
        pg = 1 / (stmts * read_s + commits * extra_commit_s)
        broker = redis["ops_per_s"] / (msgs * redis_per_msg)
        return {
            "turns": turns,
            "statements": round(stmts, 1),
            "commits": round(commits, 1),
            "broker_commands": round(msgs * redis_per_msg, 1),
            "postgres_rollouts_per_s": round(pg),
            "redis_rollouts_per_s": round(broker),
            "rollouts_per_s": round(min(pg, broker)),
            "turns_per_s": round(min(pg, broker) * turns),
            "first_limit": "postgresql" if pg < broker else "redis",
        }

    return {
        "per_turn": {k: round(v, 2) for k, v in per_turn.items()},
        "per_rollout_fixed": {k: round(v, 2) for k, v in fixed.items()},
        "redis_commands_per_message": round(redis_per_msg, 2),
        "node_fixed_pg_share_per_s": round(node_pg_s, 5),
        # three pools of `pool` plus a single-threaded reaper; the gateway takes 4 + 1
        "connections_per_node": 3 * pool + 1,
        "nodes_before_max_connections": (max_connections - pool - 1) // (3 * pool + 1),
        "by_turns": [rollouts_per_s(t) for t in (1, 4, 16)],
    }


def cluster_rows(m: dict, rollout_s: float, turns: int, run_slots: int) -> dict:
    """Nodes of `run_slots` RUN slots running `rollout_s`-second rollouts of `turns` turns:
    how many one PostgreSQL + one Redis carry (Little's law: slots = rate x duration)."""
    row = next(r for r in m["by_turns"] if r["turns"] == turns)
    per_node = run_slots / rollout_s  # rollouts/s one node produces
    # each node also costs the server its heartbeats and reaper passes, busy or not
    pg_nodes = 1 / (per_node / row["postgres_rollouts_per_s"] + m["node_fixed_pg_share_per_s"])
    redis_nodes = row["redis_rollouts_per_s"] / per_node
    return {
        "rollout_s": rollout_s,
        "turns": turns,
        "run_slots_per_node": run_slots,
        "nodes_by_postgresql": int(pg_nodes),
        "nodes_by_redis": int(redis_nodes),
        "nodes_by_connections": m["nodes_before_max_connections"],
        "slots_total": int(min(pg_nodes, redis_nodes)) * run_slots,
    }
