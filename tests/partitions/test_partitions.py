"""Issue 42: a node alive but cut off, slowed or reset on its links; the gateway cut off from
Redis during a submission. Every schedule ends with nothing lost, duplicated or wrongly
rewarded, no sandbox left, and a history the checker finds clean (bench/support/partitions/checker.py).
The figures per schedule are printed by bench/partitions.py."""

from __future__ import annotations

import pytest

from bench.support.partitions.schedules import SCHEDULES

pytestmark = [pytest.mark.partitions, pytest.mark.service, pytest.mark.timeout(600)]


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_a_partition_loses_duplicates_and_leaks_nothing(schedule_report, name):
    report = schedule_report(name)
    assert report.problems() == [], (report.problems(), report.notes)
    assert report.finished == report.rollouts and set(report.outcomes) == {"completed"}, report
    assert report.llm_calls >= 4, report  # the agents really ran
