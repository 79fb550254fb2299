"""raas node jobs under a real Slurm (`make test-slurm`): a plain `scancel` mid-RUN, a time
limit and a `scontrol requeue`, each under `proctrack/cgroup` (where the cgroup v1 freezer
is writable) and `proctrack/linuxproc`, end with every rollout completed with its right
reward: 0 lost, 0 duplicated, 0 wrong rewards, no agent_error. The node job is the one
`raas slurm write` ships, submitted with `SBATCH_EXPORT=NONE`; re-runs from INIT are
printed (the figures of docs/slurm.md and BENCHMARKS.md come from bench/slurm.py).
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REDIS_URL
from tests.slurm.cluster import SlurmCluster, available_proctracks
from tests.slurm.scenario import SlurmScenario

pytestmark = pytest.mark.slurm


def shared_env_root(home: Path) -> Path:
    """A shared environment root as a login node leaves it: `math` built, marked shared
    (the build itself is cached once per machine, as the fault suite does)."""
    from sandbox.environments import SHARED_MARK, build_environment

    built = Path(build_environment("math", ["sympy", "numpy"])).resolve()
    root = home / "envs-shared"
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "math").exists():
        (root / "math").symlink_to(built)
    (root / SHARED_MARK).write_text("compute nodes use these environments read-only\n")
    return root


@pytest.fixture(scope="module", params=available_proctracks())
def scenario(request, tmp_path_factory, pg_url_module) -> Iterator[SlurmScenario]:
    """A private Slurm cluster with this proctrack plugin, and the service around it."""
    cluster = SlurmCluster(request.param).start()
    home = tmp_path_factory.mktemp(f"slurm-{request.param}")
    s = SlurmScenario(home, cluster, pg_url_module, REDIS_URL, shared_env_root(home))
    yield s
    s.close()
    cluster.stop()


@pytest.mark.parametrize("fault", ["scancel", "timelimit", "requeue"])
def test_struck_node_job_loses_nothing_and_grades_right(scenario, fault):
    report = scenario.run(fault, "shipped")
    print(json.dumps(report.as_dict()))
    assert report.in_run_at_strike > 0, report  # the fault hit rollouts mid-RUN
    assert report.problems() == [], (report, scenario.job_log(scenario.job_ids[0])[-3000:])
    assert report.agent_errors == 0
    assert report.completed == report.rollouts
    assert report.orphans == 0  # nothing of the node outlives its job, under any proctrack
