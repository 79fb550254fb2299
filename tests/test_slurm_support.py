"""What the Slurm support ships, without a Slurm: the job scripts `raas slurm write` makes,
node-local state inside a job, and environments that compute nodes use but never build
(a shared root, a wheelhouse for sites without a package index). The scripts themselves
run under a real Slurm in tests/slurm (`make test-slurm`)."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from app.ops.cli import main
from app.ops.slurm import SlurmJobConfig
from core.settings import Settings
from sandbox.environments import (
    SHARED_MARK,
    EnvironmentMissing,
    build_environment,
    ensure_environment,
)

REPO = Path(__file__).resolve().parent.parent


def test_slurm_write_sizes_the_node_job_and_drains_correctly(tmp_path):
    env = {
        "RAAS_DATABASE_URL": "postgresql://u:pw@db/raas",
        "RAAS_NODE": "login1",
        "RAAS_HOME": "/shared/me/.raas",
        "RAAS_ENV_ROOT": str(tmp_path / "envs"),
    }
    result = CliRunner().invoke(
        main,
        [
            "slurm",
            "write",
            str(tmp_path / "jobs"),
            "--init",
            "4",
            "--run",
            "32",
            "--eval",
            "4",
            "--nodes",
            "3",
            "--drain",
            "90",
        ],
        env=env,
    )
    assert result.exit_code == 0, result.output
    node = (tmp_path / "jobs" / "node.sbatch").read_text()
    assert "#SBATCH --array=0-2" in node and "#SBATCH --requeue" in node
    assert "#SBATCH --cpus-per-task=11" in node  # 4 + 4 + 32/16 + 1
    assert "#SBATCH --mem=43008M" in node  # 40 slots x 1024 MB + 2048
    assert "--mem=" in node and "node job: 11 CPUs, 43008 MB" in result.output
    assert "#SBATCH --signal=B:TERM@120" in node  # the batch shell only, drain + margin
    assert 'raas node --node "$RAAS_NODE" --init 4 --run 32 --eval 4 &' in node
    assert re.search(r"trap '.*kill -TERM \"\$NODE_PID\"", node)  # raas node only
    assert "export RAAS_SOFT_SHUTDOWN_TIMEOUT=90" in node
    assert "SLURM_TMPDIR:-${TMPDIR:-/tmp}" in node
    env_file = tmp_path / "jobs" / "raas.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600  # it holds the database URL
    text = env_file.read_text()
    assert "export RAAS_DATABASE_URL=postgresql://u:pw@db/raas" in text
    assert f"export RAAS_ENV_ROOT={tmp_path / 'envs'}" in text
    assert "RAAS_NODE" not in text and "RAAS_HOME" not in text  # node-local: the job's own
    for script in ("node.sbatch", "services.sbatch"):
        subprocess.run(["bash", "-n", str(tmp_path / "jobs" / script)], check=True)


def test_examples_slurm_are_what_raas_slurm_write_makes(tmp_path):
    """examples/slurm holds the default scripts; they must not drift from the generator."""
    CliRunner().invoke(main, ["slurm", "write", str(tmp_path)], env={"RAAS_ENV_ROOT": ""})
    for name in ("node.sbatch", "services.sbatch"):
        shipped = (REPO / "examples" / "slurm" / name).read_text()
        made = (tmp_path / name).read_text().replace(str(tmp_path.resolve()), "/path/to/raas-slurm")
        assert shipped == made, f"regenerate examples/slurm/{name} (docs/slurm.md)"


def test_home_is_node_local_scratch_inside_a_slurm_job(monkeypatch, tmp_path):
    for name in ("RAAS_HOME", "SLURM_TMPDIR", "TMPDIR"):
        monkeypatch.delenv(name, raising=False)
    assert Settings().home == Path(".raas")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert Settings().home == Path("/tmp/raas-4242/home")
    monkeypatch.setenv("SLURM_TMPDIR", str(tmp_path))
    assert Settings().home == tmp_path / "raas-4242" / "home"
    monkeypatch.setenv("RAAS_HOME", "/elsewhere")
    assert Settings().home == Path("/elsewhere")


def test_a_node_never_builds_in_a_shared_root(tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    (root / SHARED_MARK).write_text("")
    with pytest.raises(EnvironmentMissing) as caught:
        ensure_environment("math", ["numpy", "sympy"], root)
    message = str(caught.value)
    assert "'math' is not built in the shared environment root" in message
    assert f"raas env build math --package numpy --package sympy --shared --root {root}" in message
    assert not (root / "math").exists()  # nothing half-built left behind


def _wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel (what a site's wheelhouse holds), made by hand."""
    files = {
        "raas_probe/__init__.py": b"VALUE = 42\n",
        "raas_probe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: raas-probe\nVersion: 1.0\n",
        "raas_probe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(data)}\n"
    record += "raas_probe-1.0.dist-info/RECORD,,\n"
    path = folder / "raas_probe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr("raas_probe-1.0.dist-info/RECORD", record)
    return path


def test_build_from_a_wheelhouse_without_an_index_marks_the_root_shared(tmp_path):
    wheelhouse = tmp_path / "wheels"
    wheelhouse.mkdir()
    _wheel(wheelhouse)
    root = tmp_path / "envs"
    runner = CliRunner()
    result = runner.invoke(
        main,
        [
            "env",
            "build",
            "probe",
            "--package",
            "raas-probe",
            "--root",
            str(root),
            "--no-index",
            "--find-links",
            str(wheelhouse),
            "--shared",
        ],
    )
    assert result.exit_code == 0, result.output
    assert (root / SHARED_MARK).exists() and not list(root.glob("*.lockdir"))
    out = subprocess.run(
        [str(root / "probe" / "bin" / "python3"), "-c", "import raas_probe; print(raas_probe.VALUE)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "42"
    assert ensure_environment("probe", ["raas-probe"], root) is False  # built: used as is
    missing = runner.invoke(
        main,
        [
            "env",
            "build",
            "other",
            "--package",
            "nothing-here",
            "--root",
            str(root),
            "--no-index",
            "--find-links",
            str(wheelhouse),
        ],
    )
    assert missing.exit_code == 1 and "building other failed" in missing.output
    assert (
        build_environment("probe", ["raas-probe"], root, no_index=True, find_links=[str(wheelhouse)]) == root / "probe"
    )
    assert os.access(root / "probe" / "bin" / "python3", os.X_OK) and sys.executable


def test_the_node_job_has_memory_for_every_worker_process():
    """64 RUN slots are two processes at the default 32 per process: 512 MB more than the 2 GB
    the first three worker processes get."""
    assert SlurmJobConfig(init=8, run=64, eval=8).worker_processes == 4
    assert SlurmJobConfig(init=8, run=64, eval=8).mem_mb == 80 * 1024 + 2048 + 512
    assert SlurmJobConfig(init=8, run=64, eval=8, slots_per_process=16).worker_processes == 6
    assert SlurmJobConfig(init=4, run=32, eval=4).mem_mb == 40 * 1024 + 2048
