"""`raas doctor` on this node: real bwrap, cgroups, PostgreSQL, Redis, an LLM server (the
simulator, a fake of vLLM), and the failures an HPC user meets, each with what to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from app.ops.doctor import check_database, check_glibc, check_userns
from core.db import session_scope
from core.models import LLMServer
from core.settings import Settings
from migrations.runner import upgrade
from sandbox.environments import SHARED_MARK
from tests.conftest import REDIS_URL
from bench.support.private_services import free_port

REPO = Path(__file__).resolve().parent.parent


def doctor(env: dict[str, str]) -> tuple[int, dict[str, dict]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAAS_")}
    run = subprocess.run(
        [sys.executable, "-m", "app.ops.cli", "doctor", "--json"],
        env={**base, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    checks = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    return run.returncode, {c["name"]: c for c in checks}


def register(db_url: str, url: str) -> None:
    with session_scope(db_url) as s:
        s.add(LLMServer(url=url))


def test_doctor_passes_on_a_working_node(tmp_path, pg_url):
    from fakellm.server import start_simulator
    from bench.support.faults.campaign import SMOLLM2

    upgrade(pg_url)
    sim_url, stop = start_simulator(SMOLLM2, {"default": ["hi"]})
    try:
        register(pg_url, sim_url)
        bare = pg_url.replace("postgresql+psycopg://", "postgresql://")  # as docs/deployment.md has it
        code, checks = doctor(
            {"RAAS_DATABASE_URL": bare, "RAAS_BROKER_URL": REDIS_URL, "RAAS_HOME": str(tmp_path / "home")}
        )
    finally:
        stop()
    assert code == 0, checks
    for name in ("bwrap sandbox", "glibc", "user namespaces", "database", "broker", f"LLM {sim_url}", "scratch"):
        assert checks[name]["status"] == "ok", checks[name]
    assert checks["cgroups"]["status"] in ("ok", "warn")
    # this kernel mounts overlayfs in a user namespace: groups fork copy-on-write
    assert checks["group fork"]["status"] == "ok" and checks["group fork"]["detail"].startswith("overlay")
    assert "fork slots: the warm pool starts forks before their layer" in checks["group fork"]["detail"]
    # nothing built in this fresh home: a node that may build says it will, with the command
    assert checks["environment math"]["status"] == "warn"
    assert "raas env build math --package numpy" in checks["environment math"]["fix"]


def test_doctor_fails_with_one_line_of_what_to_do(tmp_path, pg_url):
    upgrade(pg_url)
    register(pg_url, f"http://127.0.0.1:{free_port()}")
    shared = tmp_path / "shared-envs"
    shared.mkdir()
    (shared / SHARED_MARK).write_text("")
    code, checks = doctor(
        {
            "RAAS_DATABASE_URL": pg_url,
            "RAAS_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0",
            "RAAS_ENV_ROOT": str(shared),
            "RAAS_HOME": str(tmp_path / "h"),
        }
    )
    assert code == 1
    failed = {name for name, c in checks.items() if c["status"] == "fail"}
    assert {"broker", "environment math"} <= failed, checks
    assert any(name.startswith("LLM http://127.0.0.1:") for name in failed), checks
    assert f"--shared --root {shared}" in checks["environment math"]["fix"]
    assert all(checks[name]["fix"] for name in failed)
    code, checks = doctor(
        {
            "RAAS_DATABASE_URL": f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/none",
            "RAAS_BROKER_URL": REDIS_URL,
            "RAAS_HOME": str(tmp_path / "h"),
        }
    )
    assert code == 1 and checks["database"]["status"] == "fail"
    assert "RAAS_DATABASE_URL" in checks["database"]["fix"]


def test_old_glibc_and_disabled_user_namespaces_fail_with_advice(tmp_path):
    old = check_glibc("glibc 2.17")
    assert old.status == "fail" and "bwrap" in old.fix
    assert check_glibc("glibc 2.28").status == "ok"
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "max_user_namespaces").write_text("0\n")
    off = check_userns(tmp_path, euid=1000)
    assert off.status == "fail" and "max_user_namespaces" in off.fix
    (tmp_path / "user" / "max_user_namespaces").write_text("63000\n")
    assert check_userns(tmp_path, euid=1000).status == "ok"


def test_a_fresh_checkout_is_told_raas_up_makes_the_database(tmp_path):
    """Before the first `raas up` the embedded home does not exist: the database line says so
    plainly (not a network failure), and doctor creates nothing."""
    home = tmp_path / "checkout" / ".raas"
    (tmp_path / "checkout").mkdir()
    code, checks = doctor({"RAAS_HOME": str(home)})
    database = checks["database"]
    assert database["status"] == "ok", database
    assert "not created yet" in database["detail"] and "`raas up` creates it" in database["detail"]
    assert str(home / "raas.db") in database["detail"]
    assert code == 0, {name: c for name, c in checks.items() if c["status"] == "fail"}
    assert not (home / "raas.db").exists()


def test_the_embedded_database_once_made_answers_and_an_impossible_home_fails(tmp_path):
    made = Settings(home=tmp_path / "home", database_url=None)
    upgrade(made.db_url)  # what `raas up` does first
    assert check_database(made).status == "ok" and "not created" not in check_database(made).detail
    (tmp_path / "a-file").write_text("")
    impossible = check_database(Settings(home=tmp_path / "a-file" / "home", database_url=None))
    assert impossible.status == "fail" and "RAAS_HOME" in impossible.fix


def test_the_pythons_harnesses_name_are_found_or_reported(tmp_path):
    """OpenHands' 3.12 (pyenv's here) is found; a version no node has is a warning naming it
    and the environment that needs it (jobs naming that harness are refused, others run)."""
    from app.ops.doctor import check_harness_pythons
    from sandbox.pythons import PythonMissing, find_python

    registered = {"future": {"command": ["x"], "python_env": "future", "packages": ["x"], "python": "3.99"}}
    settings = Settings(home=tmp_path, policy={"harnesses": {"registered": registered}})
    [check] = check_harness_pythons(settings)
    assert (check.name, check.status) == ("python 3.99", "warn")
    assert "no Python 3.99" in check.detail and "future environment" in check.detail and "3.99" in check.fix
    try:
        found = find_python("3.12")
    except PythonMissing:
        return  # a host without 3.12: the shipped preset's line is a warning, checked above
    [shipped] = check_harness_pythons(Settings(home=tmp_path))
    assert (shipped.name, shipped.status) == ("python 3.12", "ok") and found.executable in shipped.detail
