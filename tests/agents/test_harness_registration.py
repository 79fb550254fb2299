"""Harness registrations in the operator policy, and what a job may ask of them (issue 23.4).

The job names a registration; the registration (trusted) says what runs. These cases check
that a registration cannot smuggle in what a job may not, and that a job's choice is held to
the policy with errors that name the field and the rule.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from agents.handlers.harness import launch
from core.errors import InvalidRequest
from core.harnesses import HarnessRegistration, default_harnesses
from core.policy import Policy, check_harness


def reg(**fields) -> HarnessRegistration:
    return HarnessRegistration(**{"command": ["agent", "--task-file", "{task_file}"], **fields})


def test_the_shipped_registrations_are_valid_and_shown_without_variable_values() -> None:
    shipped = default_harnesses()
    assert {"mini-swe-agent", "openai-agent", "anthropic-agent"} <= set(shipped)
    assert shipped["anthropic-agent"].command[-2:] == ["--api", "anthropic"]
    public = Policy(harnesses={"registered": {"x": reg(env={"SECRETISH": "value"})}}).public()
    assert public["harnesses"]["registered"]["x"]["env"] == ["SECRETISH"]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"command": ["agent", "{home}"]}, "unknown placeholder"),
        ({"command": ["agent", "{task_file"]}, "command[1]"),
        ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, "LD_PRELOAD"),
        ({"env": {"PYTHONPATH": "/tmp"}}, "PYTHONPATH"),
        ({"env": {"BAD NAME": "x"}}, "BAD NAME"),
        ({"endpoint_env": {"OPENAI_API_KEY": "{token}"}}, "no variable gives the harness"),
        ({"task_file": "/etc/passwd"}, "under /tmp"),
        ({"task_file": "/tmp/../etc/x"}, "under /tmp"),
        ({"answer_file": "/etc/answer"}, "inside the workspace"),
        ({"answer_file": "../answer"}, "inside the workspace"),
        ({"python_env": "/home/me/venv"}, "python_env"),
        ({"command": []}, "command"),
        ({"shell": "sh -c x"}, "shell"),
        ({"python": "python3.12"}, "python"),
        ({"python": "/usr/bin/python3"}, "python"),
    ],
)
def test_a_bad_registration_fails_at_start_up_naming_the_field(fields, message) -> None:
    with pytest.raises(ValidationError, match=message.replace("[", r"\[")):
        reg(**fields)


def test_a_job_is_held_to_the_registrations_and_the_tenant_rules() -> None:
    policy = Policy(
        harnesses={"registered": {"open": reg(tasks=["swe"], python_env="agent-env"), "admins": reg(tenants=False)}},
        sandbox={"python_envs": ["other-env"]},
    )
    assert check_harness(policy, "open", "swe", admin=True).python_env == "agent-env"
    with pytest.raises(InvalidRequest, match="registered: open") as err:
        check_harness(policy, "admins", "swe", admin=False)  # tenants do not even see it
    assert err.value.details["policy"] == "policy.harnesses.registered"
    assert check_harness(policy, "admins", "math", admin=True)
    with pytest.raises(InvalidRequest, match="does not run 'math'"):
        check_harness(policy, "open", "math", admin=True)
    with pytest.raises(InvalidRequest, match="python environment 'agent-env' is not allowed"):
        check_harness(policy, "open", "swe", admin=False)
    with pytest.raises(InvalidRequest, match="not a registered name"):
        check_harness(policy, "/usr/bin/sh", "swe", admin=True)


def test_a_harness_naming_a_python_the_node_lacks_is_refused_at_submission() -> None:
    """Not deep in RUN: the job is refused with the version named (`sandbox.pythons`)."""
    from agents.handlers.harness.handler import HarnessConfig, HarnessHandler

    policy = Policy(harnesses={"registered": {"future": reg(python_env="future", packages=["x"], python="3.99")}})
    config = HarnessConfig(harness="future", task="swe")
    with pytest.raises(InvalidRequest, match=r"needs Python 3\.99: no Python 3\.99 on this node") as err:
        HarnessHandler().check_policy(config, policy, admin=True)
    assert err.value.details["policy"] == "policy.harnesses.pythons"
    # a version the operator maps to an interpreter that is not there: refused the same way
    mapped = Policy(
        harnesses={
            "registered": {"m": reg(python_env="m", packages=["x"], python="3.12")},
            "pythons": {"3.12": "/nonexistent/python3.12"},
        }
    )
    with pytest.raises(InvalidRequest, match="/nonexistent/python3.12"):
        HarnessHandler().check_policy(HarnessConfig(harness="m", task="swe"), mapped, admin=True)
    with pytest.raises(ValidationError, match="absolute path"):
        Policy(harnesses={"pythons": {"3.12": "python3.12"}})


def test_the_command_and_variables_are_rendered_from_the_registration_only() -> None:
    harness = reg(
        command=["agent", "--task", "{task}", "-m", "{model}"],
        env={"WORKDIR": "{workspace}", "OPENAI_BASE_URL": "overridden"},
        endpoint_env={"OPENAI_BASE_URL": "{base_url}", "KEY": "{token}"},
    )
    fields = {
        "task_file": "/tmp/t",
        "task": "fix {it}; rm -rf / $(x)",
        "workspace": "/w",
        "model": "m",
        "answer_file": "a",
    }
    argv, env = launch.render(
        harness,
        fields,
        {"base_url": "http://127.0.0.1:5/v1", "root_url": "http://127.0.0.1:5", "token": "tok", "port": "5"},
    )
    # the task text is one argv word as it is (never a shell line, braces not re-expanded)
    assert argv == ["agent", "--task", "fix {it}; rm -rf / $(x)", "-m", "m"]
    assert env == {"WORKDIR": "/w", "OPENAI_BASE_URL": "http://127.0.0.1:5/v1", "KEY": "tok"}


def test_the_task_text_is_the_task_kinds_own_prompt() -> None:
    harness = reg()
    swe = launch.task_text("swe", {"problem_statement": "The bug.", "instance_id": "i"}, "/ws", harness)
    assert "The bug." in swe and "/ws" in swe
    code = launch.task_text(
        "code", {"problem_statement": "Write f.", "solution_file": "f.py", "hidden_tests": []}, "/ws", harness
    )
    assert "Write f." in code and "f.py" in code
    math = launch.task_text("math", {"problem": "1+1?"}, "/ws", harness)
    assert math.startswith("1+1?") and "answer.txt" in math
    raw = launch.task_text("swe", {"problem_statement": "as is"}, "/ws", reg(task_field="problem_statement"))
    assert raw == "as is"


def test_a_registered_harness_environment_is_built_on_first_use(monkeypatch, tmp_path) -> None:
    """As a handler's declared environment: a fresh node runs without a manual build step."""
    import sandbox.environments
    from core.settings import Settings
    from tasks.sandboxing.sandboxes import ensure_declared_environment

    built: list[tuple[str, list[str], list[str], str, dict]] = []
    monkeypatch.setattr(
        sandbox.environments,
        "ensure_environment",
        lambda name, packages, root, python, npm=(), pythons={}: built.append(
            (name, packages, list(npm), python, dict(pythons))
        ),
    )
    registered = {
        "mine": reg(python_env="my-env", packages=["my-agent==1.0"]),
        "node": reg(python_env="node-env", npm_packages=["some-cli@1"]),
        "new": reg(python_env="new-env", packages=["new-agent"], python="3.12"),
    }
    mapping = {"3.12": "/opt/py312/bin/python3.12"}
    settings = Settings(home=tmp_path, policy={"harnesses": {"registered": registered, "pythons": mapping}})
    ensure_declared_environment(settings, "my-env")
    ensure_declared_environment(settings, "node-env")
    ensure_declared_environment(settings, "new-env")
    ensure_declared_environment(settings, "unknown-env")  # left to the runtime's error
    assert built == [
        ("my-env", ["my-agent==1.0"], [], "/usr/bin/python3", mapping),
        ("node-env", [], ["some-cli@1"], "/usr/bin/python3", mapping),
        ("new-env", ["new-agent"], [], "3.12", mapping),  # the version, found by the operator's map
    ]
    shipped = default_harnesses()["openai-agent"].packages
    assert Path(shipped[-1], "raas_openai_agent.py").is_file()  # the example, installable
