"""Singularity: exact command lines (fake only at the command boundary) and, if installed, the real thing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sandbox import Bind, SandboxLimits, SandboxSpec, SandboxStartError, list_sandboxes, stop_handle
from sandbox.inside import PTYPROCESS_DIR, TOOLSERVER_DIR
from sandbox.singularity import SingularityCommands, SingularityRuntime


class FakeSingularityCommands(SingularityCommands):
    """FAKE of the apptainer binary: records command lines; `exec instance://` runs the inner
    command on the host with the instance's binds mapped back to host paths."""

    def __init__(self) -> None:
        super().__init__("apptainer")
        self.calls: list[list[str]] = []
        self.binds: list[tuple[str, str]] = []

    def run(self, argv, timeout):
        self.calls.append(argv)
        if argv[1:3] == ["instance", "start"]:
            self.binds = [tuple(v.split(":")[:2]) for k, v in zip(argv, argv[1:]) if k == "--bind"]
        return subprocess.CompletedProcess(argv, 0, "", "")

    def spawn(self, argv, env, log_file):
        self.calls.append(argv)
        inner = argv[next(i for i, a in enumerate(argv) if a.startswith("instance://")) + 1 :]
        env = dict(v.split("=", 1) for k, v in zip(argv, argv[1:]) if k == "--env")
        env["PYTHONPATH"] = f"{Path(TOOLSERVER_DIR).parent}:{Path(PTYPROCESS_DIR).parent}"
        inner = [self._to_host(a) for a in inner]
        inner[0] = shutil.which("python3") if not os.path.exists(inner[0]) else inner[0]
        return super().spawn(inner, env, log_file)

    def _to_host(self, arg: str) -> str:
        for host, target in self.binds:
            if arg.startswith(target + "/") and target.startswith("/run/"):
                return host + arg[len(target) :]
        return arg


@pytest.fixture
def fake_rt(state_dir, tmp_path):
    image = tmp_path / "img.sif"
    image.write_text("not really an image")
    rt = SingularityRuntime(state_dir=state_dir, commands=FakeSingularityCommands(), image_cache=tmp_path / "cache")
    return rt, str(image)


def test_instance_start_command_line(fake_rt, workspace, tmp_path):
    rt, image = fake_rt
    (tmp_path / "sock").mkdir()
    handle = {"socket_dir": str(tmp_path / "sock"), "instance": "raas-abc"}
    spec = SandboxSpec(workspace=workspace, image=image, binds=[Bind(host=str(tmp_path), sandbox="/data")])
    assert rt.start_argv(spec, handle, image, None) == [
        "apptainer",
        "instance",
        "start",
        "--containall",
        "--writable-tmpfs",
        "--no-mount",
        "home,cwd",
        "--net",
        "--network",
        "none",
        "--bind",
        f"{workspace}:{workspace}",
        "--bind",
        f"{tmp_path}/sock:/run/raas",
        "--bind",
        f"{TOOLSERVER_DIR}:/opt/raas/toolserver:ro",
        "--bind",
        f"{PTYPROCESS_DIR}:/opt/raas/lib/ptyprocess:ro",
        "--bind",
        f"{tmp_path}:/data:ro",
        image,
        "raas-abc",
    ]
    online = spec.model_copy(update={"network": True, "fakeroot": True, "binds": []})
    argv = rt.start_argv(online, handle, image, None)
    assert "--network" not in argv and argv[7] == "--fakeroot"


def test_missing_bind_is_a_typed_error_not_sys_exit(fake_rt, workspace):
    rt, image = fake_rt
    spec = SandboxSpec(workspace=workspace, image=image, binds=[Bind(host="/nonexistent/raas")])
    with pytest.raises(SandboxStartError, match="does not exist"):
        rt.start_argv(spec, {"socket_dir": "/s", "instance": "i"}, image, None)


def test_exec_and_pull_command_lines(fake_rt, workspace):
    rt, image = fake_rt
    spec = SandboxSpec(
        workspace=workspace, image=image, env={"A": "1"}, limits=SandboxLimits(output_bytes=1000, file_size_mb=1)
    )
    argv = rt.exec_argv(spec, {"instance": "raas-abc"}, None)
    assert argv[:5] == ["apptainer", "exec", "--cleanenv", "--pwd", "/"]
    assert "A=1" in argv and "PYTHONPATH=/opt/raas:/opt/raas/lib" in argv
    tail = argv[argv.index("instance://raas-abc") :]
    assert tail[:11] == [
        "instance://raas-abc",
        "/usr/bin/python3",
        "-s",
        "-B",
        "-m",
        "toolserver",
        "--socket",
        "/run/raas/tool.sock",
        "--workspace",
        workspace,
        "--workdir",
    ]
    limits = tail[tail.index("--python") + 2 :]
    nproc = [] if os.geteuid() == 0 else ["--nproc", limits[limits.index("--nproc") + 1]]
    assert limits == [
        "--output-bytes",
        "1000",
        "--fsize",
        str(1024 * 1024),
        *nproc,
        "--address-space",
        str(4096 * 1024 * 1024),
    ]
    assert rt.pull_argv("docker://python:3.11", "/c/x.sif") == ["apptainer", "pull", "/c/x.sif", "docker://python:3.11"]


def test_docker_images_are_pulled_once(fake_rt):
    rt, _ = fake_rt
    first = rt.resolve_image("docker://python:3.11-slim")
    Path(first).write_text("pulled")  # what a real pull leaves behind
    assert rt.resolve_image("docker://python:3.11-slim") == first
    pulls = [c for c in rt.commands.calls if c[1] == "pull"]
    assert len(pulls) == 1 and pulls[0][-1] == "docker://python:3.11-slim"
    with pytest.raises(SandboxStartError, match="needs an image"):
        rt.resolve_image(None)


def test_full_lifecycle_through_the_fake(fake_rt, workspace, state_dir):
    rt, image = fake_rt
    sb = rt.start(SandboxSpec(workspace=workspace, image=image), label="r:1")
    assert sb.bash("echo hi").output == "hi\n"
    assert [h["label"] for h in list_sandboxes(state_dir)] == ["r:1"]
    stop_handle(sb.handle)
    assert list_sandboxes(state_dir) == []


def test_real_singularity(state_dir, workspace, capsys):
    binary = shutil.which("apptainer") or shutil.which("singularity")
    image = os.environ.get("RAAS_TEST_SIF")
    if binary is None or image is None:
        reason = "apptainer/singularity not on PATH" if binary is None else "set RAAS_TEST_SIF to a .sif with python3"
        with capsys.disabled():
            print(f"\nSKIP real singularity test: {reason}")
        pytest.skip(reason)
    sb = SingularityRuntime(state_dir=state_dir).start(SandboxSpec(workspace=workspace, image=image))
    try:
        assert sb.bash("echo hi").output == "hi\n"
        assert sb.python("1+1").output == "2\n"
    finally:
        sb.stop()


def test_a_model_endpoint_folder_is_bound_read_only(fake_rt, workspace, tmp_path):
    """Issue 23: the endpoint's socket folder goes in read-only, like bwrap's."""
    rt, image = fake_rt
    (tmp_path / "sock").mkdir()
    (tmp_path / "ep").mkdir()
    handle = {"socket_dir": str(tmp_path / "sock"), "instance": "raas-abc", "endpoint_dir": str(tmp_path / "ep")}
    spec = SandboxSpec(workspace=workspace, image=image, model_endpoint=True)
    argv = rt.start_argv(spec, handle, image, None)
    assert argv[argv.index(f"{tmp_path}/ep:/run/raas-model:ro") - 1] == "--bind"


def test_an_environments_python_install_is_bound_read_only_beside_it(fake_rt, workspace, tmp_path):
    """Issue 36: a venv of pyenv's 3.12 needs its base install too; the same bind as bwrap's
    (that folder only), and none for the system python's."""
    import json

    rt, image = fake_rt
    (tmp_path / "sock").mkdir()
    base = tmp_path / "pyenv" / "versions" / "3.12.1"
    base.mkdir(parents=True)
    env = tmp_path / "env"
    env.mkdir()
    (env / "raas-env.json").write_text(json.dumps({"packages": [], "python": "x", "base_prefix": str(base)}))
    handle = {"socket_dir": str(tmp_path / "sock"), "instance": "raas-abc"}
    argv = rt.start_argv(SandboxSpec(workspace=workspace, image=image), handle, image, str(env))
    assert argv[argv.index(f"{base}:{base}:ro") - 1] == "--bind"
    assert argv[argv.index(f"{env}:{env}:ro") - 1] == "--bind"
    (env / "raas-env.json").write_text(json.dumps({"packages": [], "python": "x", "base_prefix": "/usr"}))
    argv = rt.start_argv(SandboxSpec(workspace=workspace, image=image), handle, image, str(env))
    assert not any("/usr" in a for a in argv if ":" in a)
