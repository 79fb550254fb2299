"""`raas validate`: the shipped examples are sound, and a broken instance of each kind is found.

Real EVAL throughout: gold and null artifacts graded by `tasks.sandboxing.grading.grade` in fresh bwrap
sandboxes (swe, code) or on the host (math), the same function the EVAL stage calls. The broken
instances are made from shipped ones:

- gold fails: swe adds a FAIL_TO_PASS test no fix can pass; code ships a wrong reference; math
  a reference answer that cannot be graded (`\\boxed{}`, an empty box from a bad extraction).
- null passes: swe lists already-passing tests as FAIL_TO_PASS; code has an input/output test
  that expects no output (which a missing solution produces).
- flaky: a test that depends on the directory it runs in (it passes only in a grade's first
  workspace, `...-gold-0`), so it flips between the k runs deterministically.

Math has no null-passes or flaky kind: its grader is deterministic, host-side, and a missing
answer is 0 by construction; the test checks that no shipped math null ever passes.
A job naming the written quarantine list is refused, over real HTTP, naming the instances.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from werkzeug.serving import make_server

from agents.handlers.swe.repo import PROJECT_ROOT
from app import create_app
from fakellm.server import start_simulator
from app.validations import ValidationCreate, create_validation, get_validation, view
from core.db import session_scope
from core.settings import Settings
from migrations.runner import upgrade
from sandbox.settings import DEFAULT_ENVS_ROOT
from tasks.validation import run_validation

pytestmark = pytest.mark.slow
EXAMPLES = PROJECT_ROOT / "examples"
SMOLLM2 = str(PROJECT_ROOT / "tests" / "fixtures" / "smollm2-tokenizer")
TIMINGS: dict[str, float] = {}


def rows(path: Path) -> list[dict[str, Any]]:
    """A JSONL file's instances in the wire form {instance_id, data}."""
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            data = {k: v for k, v in row.items() if k != "instance_id"}
            out.append({"instance_id": row["instance_id"], "data": data})
    return out


def new_test_file(path: str, body: str) -> str:
    """A diff creating `path` with `body`."""
    lines = body.splitlines()
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
        f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{line}\n" for line in lines)
    )


FIRST_RUN_ONLY = "import os\n\n\ndef test_runs_in_first_workspace():\n    assert os.getcwd().endswith('-0')\n"
NEVER = "def test_never_passes():\n    assert False\n"


def broken_swe(shipped: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{problem: instance} made from the first shipped swe instance."""
    base = shipped[0]

    def variant(suffix: str, **change: Any) -> dict[str, Any]:
        inst = copy.deepcopy(base)
        inst["instance_id"] = f"{base['instance_id']}-{suffix}"
        inst["data"].update(change)
        return inst

    data = base["data"]
    f2p = json.loads(data["FAIL_TO_PASS"]) if isinstance(data["FAIL_TO_PASS"], str) else data["FAIL_TO_PASS"]
    p2p = json.loads(data["PASS_TO_PASS"]) if isinstance(data["PASS_TO_PASS"], str) else data["PASS_TO_PASS"]
    return {
        "gold_fails": variant(
            "gold-fails",
            test_patch=data["test_patch"] + new_test_file("tests/test_never.py", NEVER),
            FAIL_TO_PASS=[*f2p, "tests/test_never.py::test_never_passes"],
        ),
        "null_passes": variant("null-passes", FAIL_TO_PASS=p2p[:2]),
        "flaky": variant(
            "flaky",
            test_patch=data["test_patch"] + new_test_file("tests/test_where.py", FIRST_RUN_ONLY),
            FAIL_TO_PASS=[*f2p, "tests/test_where.py::test_runs_in_first_workspace"],
        ),
    }


def broken_code(shipped: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{problem: instance} made from the first shipped code instance (fizzbuzz)."""
    base = shipped[0]

    def variant(suffix: str, **change: Any) -> dict[str, Any]:
        inst = copy.deepcopy(base)
        inst["instance_id"] = f"{base['instance_id']}-{suffix}"
        inst["data"].update(change)
        return inst

    tests = base["data"]["hidden_tests"]
    return {
        "gold_fails": variant("gold-fails", reference_solution="def fizzbuzz(n):\n    return []\n"),
        "null_passes": variant("null-passes", hidden_tests=[{"name": "quiet", "input": "", "output": ""}]),
        "flaky": variant(
            "flaky",
            hidden_tests=[
                *tests,
                {"name": "where", "call": "__import__('os').getcwd().endswith('-0')", "expected": "True"},
            ],
        ),
    }


def broken_math(shipped: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{problem: instance}: math can only be broken by an ungradable reference."""
    inst = copy.deepcopy(shipped[0])
    inst["instance_id"] = "math-gold-fails"
    inst["data"]["answer"] = "\\boxed{}"
    return {"gold_fails": inst}


SETS = {
    "swe": (EXAMPLES / "swe" / "instances.jsonl", broken_swe, 2),
    "code": (EXAMPLES / "code.jsonl", broken_code, 2),
    "math": (EXAMPLES / "math.jsonl", broken_math, 1),
}


@pytest.fixture(scope="module")
def settings(tmp_path_factory) -> Settings:
    """A node's settings: its own home and SQLite, the machine's built environments, bwrap."""
    home = tmp_path_factory.mktemp("validate-home")
    settings = Settings(home=home, env_root=DEFAULT_ENVS_ROOT, sandbox_runtime="bwrap")
    upgrade(settings.db_url)
    return settings


def validated(settings: Settings, agent: str, instances: list[dict[str, Any]], k: int, name: str) -> Any:
    """Store and run a validation as `raas validate` does; its report."""
    body = ValidationCreate(agent=agent, instances=instances, k=k, name=name)
    validation_id = create_validation(settings, body, "default")
    run_validation(settings, validation_id, parallel=2)
    with session_scope(settings.db_url) as s:
        return view(get_validation(s, validation_id, "default"))


@pytest.mark.parametrize("agent", ["math", "swe", "code"])
def test_every_broken_instance_is_found_and_no_sound_one(settings, agent) -> None:
    path, make_broken, k = SETS[agent]
    shipped = rows(path)
    broken = make_broken(shipped)
    started = time.monotonic()
    report = validated(settings, agent, [*shipped, *broken.values()], max(k, 2), f"{agent}-list")
    TIMINGS[agent] = time.monotonic() - started
    assert report.status == "done", report.error
    by_id = {i.instance_id: i for i in report.instances}
    assert len(by_id) == len(shipped) + len(broken)
    for problem, inst in broken.items():
        found = by_id[inst["instance_id"]]
        assert problem in found.problems, found
    assert sorted(report.quarantined) == sorted(i["instance_id"] for i in broken.values())
    for inst in shipped:  # sound: gold always 1, null always 0, k times
        found = by_id[inst["instance_id"]]
        assert found.gold_rewards == [1.0] * max(k, 2) and found.null_rewards == [0.0] * max(k, 2), found
    flaky = broken.get("flaky")
    if flaky is not None:  # passes in each action's first workspace only: 1 then below 1
        rewards = by_id[flaky["instance_id"]].gold_rewards
        assert rewards[0] == 1.0 and rewards[1] < 1.0
    print(f"\nvalidate {agent}: {len(shipped)} shipped + {len(broken)} broken, k={max(k, 2)}: {TIMINGS[agent]:.1f}s")


def test_a_job_naming_the_list_is_refused_for_quarantined_instances(settings) -> None:
    """Over real HTTP: the list is readable by name; a submission naming it is a 400 that names
    every quarantined instance and why; the sound ones are accepted; an unknown list is a 400."""
    shipped = rows(EXAMPLES / "math.jsonl")[:3]
    broken = broken_math(shipped)["gold_fails"]
    report = validated(settings, "math", [*shipped, broken], 2, "math-http")
    assert report.quarantined == ["math-gold-fails"]
    sim_url, stop_sim = start_simulator(SMOLLM2, {"default": ["\\boxed{1}"]})
    app = create_app(settings)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.server_port}", timeout=60) as client:
            listed = client.get("/v1/quarantine/math-http").json()
            assert listed["instance_ids"] == ["math-gold-fails"] and listed["reasons"] == {
                "math-gold-fails": ["gold_fails"]
            }
            llm = {"servers": [{"url": sim_url}], "tokenizer": SMOLLM2, "max_model_len": 4096}
            job = {"agent": "math", "agent_config": {"tools": []}, "llm": llm}
            refused = client.post("/v1/jobs", json={**job, "instances": [*shipped, broken], "quarantine": "math-http"})
            assert refused.status_code == 400, refused.text
            body = refused.json()
            assert "math-gold-fails (gold_fails)" in body["message"] and body["details"]["field"] == "quarantine"
            assert body["details"]["instances"] == ["math-gold-fails"]
            unknown = client.post("/v1/jobs", json={**job, "instances": shipped, "quarantine": "no-such-list"})
            assert unknown.status_code == 400 and "does not exist" in unknown.json()["message"]
            bad_name = client.post("/v1/jobs", json={**job, "instances": shipped, "quarantine": "../x"})
            assert bad_name.status_code == 400 and "quarantine" in bad_name.text
            accepted = client.post("/v1/jobs", json={**job, "instances": shipped, "quarantine": "math-http"})
            assert accepted.status_code == 202, accepted.text
    finally:
        server.shutdown()
        stop_sim()


@pytest.mark.service
def test_the_service_validates_through_a_worker_and_the_sdk_reads_the_list(tmp_path) -> None:
    """`RaasClient.validate` -> POST /v1/validations -> the `raas.validate` task on a real `init`
    worker process -> the report; the list it wrote refuses a job submitted with the SDK."""
    from raas_client import RaasHTTPError

    from tests.pipeline_harness import start_service

    svc = start_service(tmp_path / "svc", stages=("init",), concurrency=1, reaper=False)
    try:
        shipped = rows(EXAMPLES / "math.jsonl")[:4]
        broken = broken_math(shipped)["gold_fails"]
        report = svc.client.validate("math", [*shipped, broken], k=2, name="sdk-list", wait=120)
        assert report.status == "done" and report.quarantined == ["math-gold-fails"], report
        assert report.problems() == {"math-gold-fails": ["gold_fails"]}
        assert all(i.gold_rewards == [1.0, 1.0] and i.null_rewards == [0.0, 0.0] for i in report.instances[:4])
        assert svc.client.quarantine("sdk-list").instance_ids == ["math-gold-fails"]
        with pytest.raises(RaasHTTPError) as refused:
            svc.client.submit("math", [broken], agent_config={"tools": []}, quarantine="sdk-list")
        assert refused.value.status == 400 and "math-gold-fails (gold_fails)" in str(refused.value.body)
        with pytest.raises(RaasHTTPError) as unknown_agent:
            svc.client.validate("search", shipped, k=1)
        assert unknown_agent.value.status == 400 and "validatable: code, math, swe" in str(unknown_agent.value.body)
    finally:
        svc.stop()


def test_the_cli_prints_the_problems_and_writes_the_list(settings, tmp_path) -> None:
    """`raas validate FILE --agent math --name ...` as a user runs it (a real process)."""
    import os
    import subprocess
    import sys

    shipped = rows(EXAMPLES / "math.jsonl")[:3]
    broken = broken_math(shipped)["gold_fails"]
    data = tmp_path / "set.jsonl"
    data.write_text(
        "".join(json.dumps({"instance_id": i["instance_id"], **i["data"]}) + "\n" for i in [*shipped, broken])
    )
    env = {**os.environ, "RAAS_HOME": str(settings.home), "RAAS_ENV_ROOT": str(DEFAULT_ENVS_ROOT.resolve())}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.ops.cli",
            "validate",
            str(data),
            "--agent",
            "math",
            "--k",
            "2",
            "--name",
            "cli-list",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=PROJECT_ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert "math-gold-fails: gold_fails (gold [0.0, 0.0], null [0.0, 0.0])" in out.stdout
    assert "4 instance(s), 3 sound, 1 quarantined, k=2" in out.stdout and "quarantine list 'cli-list'" in out.stdout
    with session_scope(settings.db_url) as s:
        from app.validations import quarantine

        assert quarantine(s, "default", "cli-list").instance_ids == ["math-gold-fails"]
