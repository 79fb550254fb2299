"""raas node jobs under a real Slurm (`make test-slurm`): a plain `scancel` mid-RUN, a time
limit and a `scontrol requeue`, each under `proctrack/cgroup` (where the cgroup v1 freezer
is writable) and `proctrack/linuxproc`, end with every rollout completed with its right
reward: 0 lost, 0 duplicated, 0 wrong rewards, no agent_error, and no rollout generates more
than its turn in flight again (a new attempt replays the logged turns into a rebuilt sandbox). The node job is the one
`raas slurm write` ships, submitted with `SBATCH_EXPORT=NONE`; re-runs from INIT are
printed (the figures of docs/slurm.md and BENCHMARKS.md come from bench/slurm.py).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REDIS_URL
from bench.support.slurm.cluster import SlurmCluster, available_proctracks
from bench.support.slurm.scenario import SlurmScenario, shared_env_root
from bench.support.waiting import wait_for

# A time-limit case takes ~3 minutes on a quiet machine (Slurm checks limits every 30 s).
pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]


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
    assert report.turns_regenerated_max <= 1, report  # issue 41: replayed, only the turn in flight again


# Its own target (`make test-slurm-services`), not CI's: once in three clean runs here the
# gateway the service job started refused connections mid-job (linuxproc); not yet explained.
@pytest.mark.slurm_services
def test_service_job_then_node_job_from_the_shipped_scripts(scenario, tmp_path):
    """A site without a service node: `services.sbatch` (PostgreSQL, Redis, the gateway in a
    job) writes its address, the node job waits for it; rollouts go through that gateway."""
    from app.ops.slurm import SlurmJobConfig, write_jobs
    from raas_client import RaasClient
    from bench.support.faults.campaign import PROBLEMS, answers_right
    from bench.support.private_services import PG_BIN, free_port
    from bench.support.slurm.scenario import MARK, RELIABILITY, SLOTS

    folder = tmp_path / "jobs"
    # as root the service job runs PostgreSQL as `postgres`, which must reach its data: a
    # folder under /tmp (pytest's tmp_path is 0700 all the way up)
    state = Path(tempfile.mkdtemp(prefix="raas-svc-", dir="/tmp"))
    state.chmod(0o711)
    environ = {
        "RAAS_SANDBOX_RUNTIME": "bwrap",
        "RAAS_PG_PORT": str(free_port()),
        "RAAS_REDIS_PORT": str(free_port()),
        "RAAS_GATEWAY_PORT": str(free_port()),
        "RAAS_SERVICES_STATE": str(state),
        **RELIABILITY,
    }
    write_jobs(
        SlurmJobConfig(
            **SLOTS, drain=5, services=True, env_root=scenario.env_root, mem_per_sandbox_mb=256, time="10:00"
        ),
        folder,
        environ,
    )
    with open(folder / "raas.env", "a") as env:  # the site's PostgreSQL module, our marker
        env.write(f'export PATH={PG_BIN}:"$PATH"\nexport {MARK}={scenario.mark}\n')
    none = {"SBATCH_EXPORT": "NONE"}
    jobs = [
        scenario.cluster.sbatch(folder / "services.sbatch", env=none),
        scenario.cluster.sbatch(folder / "node.sbatch", env=none),
    ]
    scenario.job_ids += jobs
    try:
        address = folder / "services.env"
        wait_for(address.exists, 120, "the service address", interval=1, context=lambda: _logs(folder))
        url = re.search(r"RAAS_URL='([^']+)'", address.read_text()).group(1)
        client = RaasClient(url, timeout=60)
        job = scenario.submit(4, client=client)
        wait_for(
            lambda: client.job(job.job_id).finished == 4,
            180,
            "4 finished rollouts",
            interval=1,
            context=lambda: _logs(folder),
        )
        results = list(client.results(job.job_id, wait=1))
        assert sorted(r.outcome for r in results) == ["completed"] * 4
        index = {p["instance_id"]: k for k, p in enumerate(PROBLEMS)}
        assert [r.reward for r in results] == [1.0 if answers_right(index[r.instance_id]) else 0.0 for r in results]
        client.close()
    finally:
        scenario.stop_nodes()
        shutil.rmtree(state, ignore_errors=True)
    assert not address.exists()  # the service job takes its address away when it ends


def _logs(folder: Path) -> str:
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted((folder / "logs").glob("*.out"))
    )
