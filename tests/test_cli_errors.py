"""Expected failures of the `raas` command end in one line that says what to do: no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.ops.cli import flower_notes
from core.settings import Settings
from tests.test_embedded_up import free_port

REPO = Path(__file__).resolve().parent.parent


def raas(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAAS_")}
    return subprocess.run(
        [sys.executable, "-m", "app.ops.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**clean, "PYTHONPATH": str(REPO), **env},
    )


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    "args", [["status"], ["status", "some-job"], ["llm", "list"], ["submit", "examples/math.jsonl", "--agent", "math"]]
)
def test_no_gateway_names_the_url_and_how_to_set_it(args):
    url = f"http://127.0.0.1:{free_port()}"
    line = one_line_error(raas(*args, RAAS_URL=url))
    assert url in line and "RAAS_URL" in line and "--url" in line and "raas up" in line


def test_llm_add_checks_that_the_server_answers():
    dead = f"http://127.0.0.1:{free_port()}"
    line = one_line_error(raas("llm", "add", dead, "--url", f"http://127.0.0.1:{free_port()}"))
    assert f"{dead}/v1/models" in line and "--no-check" in line


def test_db_upgrade_with_the_database_down_names_it():
    url = f"postgresql://raas@127.0.0.1:{free_port()}/raas"
    line = one_line_error(raas("db", "upgrade", RAAS_DATABASE_URL=url))
    assert "cannot reach the database at" in line and "RAAS_DATABASE_URL" in line


def test_flower_says_what_it_needs_on_the_embedded_default(tmp_path):
    notes = flower_notes(Settings(home=tmp_path))
    assert len(notes) == 1 and "RAAS_TASK_EVENTS=true" in notes[0]  # its Broker page works
    assert flower_notes(Settings(home=tmp_path, task_events=True)) == []
