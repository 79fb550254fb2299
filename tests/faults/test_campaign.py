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


@pytest.mark.parametrize(
    "name", ["redis-restart", "redis-restart-aof", "postgres-restart-fast", "postgres-restart-immediate"]
)
def test_a_3s_outage_reruns_no_rollout(fault_report, name):
    report = fault_report(name)
    assert report.rerun_rollouts == 0 and report.retried_rollouts == 0, report


def test_a_redis_restart_during_acks_ends_no_pool_and_reruns_nothing(fault_report):
    """Issue 26: a Redis restart without persistence during acks, with n2's EVAL consumer
    forced to fail once and no supervisor: every pool is alive at the end (the consumer
    restarted in its process), and nothing is lost, stuck, re-run from INIT or regenerated."""
    report = fault_report("redis-restart-during-acks")
    assert report.outcomes == {"completed": report.rollouts} and report.lost == 0, report
    assert report.retried_rollouts == 0 and report.rerun_rollouts == 0, report
    assert report.regenerated_calls == 0, report
    assert report.pools_exited == 0, report.notes
    [seen] = [n for n in report.notes if n.startswith("eval.n2 consumer:")]
    assert "failed 0x" not in seen and "unrecoverable 0x" in seen, seen  # it did fail


def test_a_lost_node_costs_at_most_the_turn_in_flight_per_rollout(fault_report):
    """Issue 41: the rollouts in RUN on the lost node get new attempts elsewhere that replay
    their logged turns into rebuilt sandboxes, so only what was not durable is generated
    again (before replay, every finished turn was): the turn in flight, and at most one turn
    whose group commit died with the SIGKILLed process (`tasks.writes.turn_log`: a turn's commit
    overlaps the next generation). At most one per affected rollout on average, as for a
    killed RUN pool."""
    report = fault_report("node-loss")
    assert report.affected_regenerated <= report.affected, report
    assert report.affected_regenerated_max <= 2, report
    assert report.replayed_turns > 0 and report.replay_divergences == 0, report


def test_a_drained_node_hands_back_promptly_and_redoes_no_finished_run(fault_report):
    """Issue 27: SIGTERM to a node's pools mid-RUN: each exits 0 within the soft timeout plus
    a few seconds; only rollouts that had not finished RUN there restart from INIT; rollouts
    whose RUN finished (before or during the drain) are graded in their attempt, elsewhere if
    need be; rewards as scripted, nothing lost (checked with the other faults above)."""
    report = fault_report("node-drain")
    [note] = [n for n in report.notes if " drained in " in n]
    seconds = float(note.split("drained in ")[1].split("s,")[0])
    assert note.endswith("exit codes [0, 0, 0]") and seconds < 2.0 + 8, note
    assert report.retried_rollouts <= report.affected, report
    assert report.rerun_rollouts <= report.affected, report
    assert report.affected_regenerated_max <= 1, report  # stopped at turn boundaries, replayed
