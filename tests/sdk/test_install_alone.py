"""`pip install './sdk[cli]'` into a fresh venv: the SDK alone, none of the server's
dependencies and none of its top-level packages; it parses real rows from a running gateway
and its `raas-client` command works.

Marked `sdk_install` (a fresh venv + pip: ~30 s under load); it runs in `make test` and alone
with `make test-sdk`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.support.pipeline_harness import start_service

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.service, pytest.mark.sdk_install]  # whole-service tier
SERVER_ONLY = (
    "celery",
    "flask",
    "transformers",
    "sqlalchemy",
    "tokenizers",
    "app",
    "core",
    "tasks",
    "agents",
    "sandbox",
    "client",
)
# Without the `cli` extra (click hidden) the command says how to get it.
BARE_CLI = "import sys; sys.modules['click'] = None; from raas_client.console import main; main()"

PROBE = textwrap.dedent("""
    import importlib.util, json, sys
    sys.modules["click"] = sys.modules["tqdm"] = None  # the SDK itself needs neither
    from raas_client import RaasClient
    url, job_id = sys.argv[1], sys.argv[2]
    absent = [m for m in sys.argv[3].split(",") if importlib.util.find_spec(m) is None]
    with RaasClient(url) as client:
        rows = client.results_page(job_id, limit=100).items  # typed: RolloutView
        batch = client.collect(job_id, groups=2, timeout=30)
    print(json.dumps({"absent": absent, "classes": [r.failure_class for r in rows],
                      "rewards": [r.reward for r in rows], "tokens": [r.response_ids for r in rows],
                      "groups": [len(g.samples) for g in batch.groups],
                      "advantages": batch.advantages()}))
""")


def test_the_sdk_installs_and_works_without_the_server(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    source = shutil.copytree(REPO / "sdk", tmp_path / "sdk")  # pip builds in the folder
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"{source}[cli]"], capture_output=True, text=True, timeout=600
    )
    assert install.returncode == 0, install.stderr[-2000:]
    svc = start_service(tmp_path / "home", concurrency=2)
    try:
        job = svc.client.submit("test-sleepy", [{"instance_id": "i0"}, {"instance_id": "i1"}], n_samples=2)
        svc.wait_done(job.job_id, timeout=60)
        probe = subprocess.run(
            [str(python), "-c", PROBE, svc.url, job.job_id, ",".join(SERVER_ONLY)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )  # not the repo: nothing of it on the path
        assert probe.returncode == 0, probe.stderr[-2000:]
        seen = json.loads(probe.stdout)
        assert seen["absent"] == list(SERVER_ONLY)
        assert seen["classes"] == ["none"] * 4
        assert sorted(seen["rewards"]) == [0.0, 0.0, 1.0, 1.0]  # test-sleepy: sample parity
        assert seen["tokens"] == [[4, 5]] * 4 and seen["groups"] == [2, 2]
        assert [round(a, 3) for a in seen["advantages"]] == [-0.707, 0.707, -0.707, 0.707]

        bare = subprocess.run(
            [str(python), "-c", BARE_CLI, "status"], capture_output=True, text=True, timeout=60, cwd=tmp_path
        )
        assert bare.returncode != 0 and "pip install 'raas-client[cli]'" in bare.stderr
        # with the `cli` extra the trainer-side commands work, without the server
        command = [str(venv / "bin" / "raas-client"), "status", job.job_id[:12], "--url", svc.url]
        shown = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["outcomes"] == {"completed": 4}
    finally:
        svc.stop()
