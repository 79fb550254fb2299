"""How a node's stage pool is split into worker processes (`app.ops.node.process_slots`), and that
`raas up` runs the same node supervisor as `raas node`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.ops.embedded import up_supervisor
from app.ops.node import NodeSupervisor, process_slots
from core.settings import Settings
import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("slots", "per_process", "split"),
    [
        (64, 32, [32, 32]),
        (70, 32, [24, 23, 23]),
        (33, 32, [17, 16]),
        (32, 32, [32]),
        (4, 32, [4]),
        (1, 1, [1]),
        (0, 32, []),
    ],
)
def test_slots_are_split_evenly_over_as_few_processes_as_hold_them(slots, per_process, split):
    assert process_slots(slots, per_process) == split
    assert sum(split) == slots
    assert all(n <= per_process for n in split)


def test_the_node_supervisor_starts_one_pool_per_process(tmp_path):
    settings = Settings(home=tmp_path, node="n1", max_slots_per_process=32)
    supervisor = NodeSupervisor(settings, {"init": 8, "run": 64, "eval": 0}, reaper=False)
    assert [(p.stage, p.slots) for p in supervisor.pools] == [("init", 8), ("run", 32), ("run", 32)]
    argv = supervisor._argv(supervisor.pools[1])
    assert argv[argv.index("--concurrency") + 1] == "32"


def test_raas_up_runs_the_node_supervisor_with_its_concurrency_per_stage(tmp_path):
    settings = Settings(home=tmp_path, max_slots_per_process=3)
    supervisor = up_supervisor(settings, 4)
    assert isinstance(supervisor, NodeSupervisor) and supervisor.with_reaper
    assert [(p.stage, p.slots) for p in supervisor.pools] == [
        ("init", 2),
        ("init", 2),
        ("run", 2),
        ("run", 2),
        ("eval", 2),
        ("eval", 2),
    ]
    init_env, run_env = supervisor._env(supervisor.pools[0]), supervisor._env(supervisor.pools[2])
    assert init_env["RAAS_INIT_AHEAD"] == "4" and "RAAS_INIT_AHEAD" not in run_env
    assert run_env["RAAS_HOME"] == str(tmp_path.resolve()) and run_env["RAAS_NODE"] == settings.node
    wide = up_supervisor(settings.model_copy(update={"max_slots_per_process": 32}), 4)
    assert [(p.stage, p.slots) for p in wide.pools] == [("init", 4), ("run", 4), ("eval", 4)]


def test_a_pool_whose_supervisor_is_gone_before_it_arms_the_parent_death_signal_exits():
    code = (
        "import os; from app.ops.node import follow_supervisor as f; f(); print(os.environ.get('RAAS_SUPERVISOR_PID'))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    mine = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "RAAS_SUPERVISOR_PID": str(os.getpid())},
        capture_output=True,
        text=True,
    )
    assert (mine.returncode, mine.stdout) == (0, "None\n")  # armed; not passed on to its children
    other = subprocess.run(
        [sys.executable, "-c", code], env={**env, "RAAS_SUPERVISOR_PID": "1"}, capture_output=True, text=True
    )
    assert (other.returncode, other.stdout) == (1, "")
