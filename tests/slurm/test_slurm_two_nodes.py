"""Two real Slurm nodes on this one machine (`make test-slurm`, issue 42): a raas node job on
each, 24 four-turn rollouts busy on both, then n2 fails (SIGKILL of its slurmd and every
process of its job) or is drained (`scontrol ... state=drain`, then `scancel --nodelist=n2`)
while n1 keeps working. Every rollout ends completed once, with the scripted reward; n1 did
the work and finished what n2 held; no sandbox is left on either node. One cluster serves
both scenarios (n2's slurmd is started again after its failure).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from tests.conftest import REDIS_URL
from bench.support.slurm.cluster import SlurmCluster, available_proctracks
from bench.support.slurm.scenario import SlurmScenario, shared_env_root
from bench.support.slurm.two_nodes import TwoNodeScenario

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory, pg_url_module) -> Iterator[TwoNodeScenario]:
    """A private two-node cluster (the first proctrack this machine runs) and the service."""
    cluster = SlurmCluster(available_proctracks()[0], nodes=2, slurmd_timeout=20)
    try:
        cluster.start()
        home = tmp_path_factory.mktemp("slurm-two-nodes")
        s = SlurmScenario(home, cluster, pg_url_module, REDIS_URL, shared_env_root(home))
        try:
            yield TwoNodeScenario(s)
        finally:
            s.close()
    finally:
        cluster.stop()


@pytest.mark.parametrize("fault", ["failure", "drain"])
def test_one_node_struck_the_other_finishes_its_work(two_nodes, fault):
    report = two_nodes.run(fault)
    print(json.dumps(report.as_dict()))
    # the strike hit real work on n2, and n1 was working too
    assert report.held_by_struck > 0 and report.struck_with_turns > 0, report
    assert report.problems() == [], report  # lost, duplicated, wrong rewards, missing tokens
    assert report.completed == report.rollouts and report.agent_errors == 0, report
    assert report.bad_turn_logs == 0, report  # each turn of an attempt stored once, in order
    # n1 really worked, and finished what n2 held (within a drain n2 may finish a few itself)
    assert report.survivor_completed >= report.held_by_struck - report.finished_on_struck, report
    assert report.taken_over + report.finished_on_struck == report.held_by_struck, report
    assert report.taken_over > 0, report
    assert report.leaked_sandboxes == {"n1": 0, "n2": 0}, report
    assert report.orphans == 0, report  # nothing of n2's job outlives it
    # a new attempt replays its logged turns: at most the turn in flight is generated again
    assert report.turns_regenerated_max <= 1, report
    if fault == "failure":
        # Slurm saw the silent slurmd after SlurmdTimeout and requeued its job (`--requeue`)
        assert "ended: n2 DOWN" in report.slurm and "restarts 1" in report.slurm, report
    else:
        assert re.search(r"drained: n2 \S*DRAIN\S*, job RUNNING", report.slurm), report
        assert report.turns_on_struck_after_drain > 0, report  # a drain stops no running job
