"""Issue 15's fault campaign as tests: every fault ends with nothing lost, duplicated or
leaked, real work done (scripted rewards, token arrays, one turn per index), and no human step;
and the faults that the issue says must not waste finished work do not.

Each fault's job runs once (tests/faults/conftest.py); the tests below judge its report. The
figures (re-generated LLM calls, re-run rollouts) are printed by bench/faults.py.
"""
from __future__ import annotations

import pytest

from tests.faults.faults import FAULTS


@pytest.mark.parametrize("name", list(FAULTS))
def test_nothing_lost_duplicated_or_leaked(fault_report, name):
    report = fault_report(name)
    assert report.problems() == [], (report.problems(), report.notes)
    assert report.finished == report.rollouts and report.affected > 0, report
    assert report.llm_calls >= 4, report  # the agents really ran
    if name == "cancel-mid-run":
        assert report.outcomes.get("cancelled", 0) > 0, report
    else:  # every rollout completed, graded as scripted (checked in problems())
        assert report.outcomes == {"completed": report.rollouts}, report


def test_a_killed_run_worker_costs_at_most_one_turn_per_rollout(fault_report):
    report = fault_report("sigkill-every-stage")
    assert report.affected_regenerated <= report.affected, report


@pytest.mark.parametrize("name", ["redis-restart", "redis-restart-aof",
                                  "postgres-restart-fast", "postgres-restart-immediate"])
def test_a_3s_outage_reruns_no_rollout(fault_report, name):
    report = fault_report(name)
    assert report.rerun_rollouts == 0 and report.retried_rollouts == 0, report


def test_a_redis_restart_during_acks_ends_no_pool_and_reruns_nothing(campaign, fault_report):
    """Issue 26: a Redis restart without persistence during acks, with n2's EVAL consumer
    forced to fail once and no supervisor: every pool is alive at the end (the consumer
    restarted in its process), and nothing is lost, stuck, re-run from INIT or regenerated."""
    report = fault_report("redis-restart-during-acks")
    assert report.outcomes == {"completed": report.rollouts} and report.lost == 0, report
    assert report.retried_rollouts == 0 and report.rerun_rollouts == 0, report
    assert report.regenerated_calls == 0, report
    assert report.pools_exited == 0, report.notes
    log = (campaign.svc.logs / "eval-n2.log").read_text(errors="replace")
    assert "restarting it in this process" in log  # the forced failure did happen
