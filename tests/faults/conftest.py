"""One campaign service for the fault suite (starting two nodes' pools costs seconds), and
each fault's job run once, its report shared by the tests that judge it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench.support.faults.campaign import Campaign, Report
from bench.support.faults.faults import FAULTS


@pytest.fixture(scope="session")
def campaign(tmp_path_factory) -> Iterator[Campaign]:
    """Two nodes on private Redis + PostgreSQL, the simulator, the `math` environment."""
    from sandbox.environments import build_environment

    env = Path(build_environment("math", ["sympy", "numpy"])).resolve()
    c = Campaign(tmp_path_factory.mktemp("faults"), envs_math=env)
    yield c
    c.close()


@pytest.fixture(scope="session")
def fault_report(campaign) -> Callable[[str], Report]:
    """(fault name) -> its job's report; the job runs at the first call."""
    done: dict[str, Report] = {}

    def get(name: str) -> Report:
        if name not in done:
            done[name] = campaign.run(FAULTS[name])
            print(json.dumps(done[name].as_dict()))
        return done[name]

    return get


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test of the fault suite is a whole-service tier (`make test`, not `make test-fast`)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.service)
