"""One partition campaign per session (two nodes behind loopback proxies), and each
schedule's job run once, its report shared by the tests that judge it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench.support.faults.campaign import Campaign, Report
from bench.support.partitions.schedules import SCHEDULES, warm_up


@pytest.fixture(scope="session")
def partitions(tmp_path_factory) -> Iterator[Campaign]:
    """Two nodes whose every link goes through a proxy of the test's (`Campaign(links=True)`)."""
    from sandbox.environments import build_environment

    env = Path(build_environment("math", ["sympy", "numpy"])).resolve()
    c = Campaign(tmp_path_factory.mktemp("partitions"), envs_math=env, links=True)
    warm_up(c)
    yield c
    c.close()


@pytest.fixture(scope="session")
def schedule_report(partitions) -> Callable[[str], Report]:
    """(schedule name) -> its job's report; the job runs at the first call."""
    done: dict[str, Report] = {}

    def get(name: str) -> Report:
        if name not in done:
            done[name] = partitions.run(SCHEDULES[name])
            print(json.dumps(done[name].as_dict()))
        return done[name]

    return get
