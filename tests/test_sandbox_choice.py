"""The job's sandbox choice is one typed model end to end: what the job set is `model_fields_set`.

The operator's policy judges exactly the options the job set (at submission and again on the
worker, from the stored config), and the defaults it left alone are the service's: they come
down to the operator's caps instead of being refused.
"""

from __future__ import annotations

import pytest

from agents.job_config import JobConfig
from core.errors import InvalidRequest
from core.policy import LimitCaps, SandboxPolicy, check_sandbox_options
from core.settings import Settings
from sandbox.spec import SandboxOptions
from tasks.sandboxing import sandboxes

POLICY = SandboxPolicy(runtimes=["bwrap"], env=["FOO"], max_limits=LimitCaps(memory_mb=1024))


def stored(sandbox: dict) -> SandboxOptions:
    """The sandbox options as a worker reads them: submitted, stored, loaded."""
    return JobConfig.load(JobConfig.model_validate({"sandbox": sandbox}).dump()).sandbox


def test_the_stored_choice_is_what_the_job_set_and_differs_from_the_defaults() -> None:
    chosen = stored({"env": {"FOO": "1"}, "network": False, "limits": {"memory_mb": 512, "max_procs": 512}})
    assert chosen.model_fields_set == {"env", "limits"}  # network false and max_procs 512 are defaults
    assert chosen.limits.model_fields_set == {"memory_mb"}
    assert sandboxes.merged_options(chosen, {"limits": {"output_bytes": 999}}) == {
        "env": {"FOO": "1"},
        "limits": {"memory_mb": 512, "output_bytes": 999},
    }


def test_the_policy_judges_the_set_fields_only() -> None:
    check_sandbox_options(POLICY, stored({}))  # default memory 4096 > cap 1024: not the job's
    check_sandbox_options(POLICY, SandboxOptions())
    with pytest.raises(InvalidRequest, match="sandbox.limits.memory_mb"):  # set, even at the default
        check_sandbox_options(POLICY, SandboxOptions.model_validate({"limits": {"memory_mb": 4096}}))
    with pytest.raises(InvalidRequest, match="sandbox.env.BAR"):
        check_sandbox_options(POLICY, stored({"env": {"BAR": "1"}}))
    with pytest.raises(InvalidRequest, match="sandbox.network"):
        check_sandbox_options(POLICY, stored({"network": True}))
    with pytest.raises(InvalidRequest, match="sandbox.runtime"):
        check_sandbox_options(POLICY, stored({"runtime": "local"}))


def test_the_worker_takes_the_runtime_from_the_typed_choice(tmp_path) -> None:
    settings = Settings(home=tmp_path, sandbox_runtime="bwrap")
    assert sandboxes.wanted_runtime(settings, stored({}), needs_sandbox=True) == "bwrap"
    assert sandboxes.wanted_runtime(settings, stored({"runtime": "local"}), needs_sandbox=False) == "none"
    with pytest.raises(InvalidRequest, match="sandbox.runtime"):  # the node's policy lists bwrap only
        sandboxes.wanted_runtime(settings, stored({"runtime": "local"}), needs_sandbox=True)
