"""Pure pieces: output capping, the wire protocol, spec validation, mounts, runtime lookup."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from sandbox import SandboxGone, SandboxOptions, SandboxSpec, UnknownRuntime, attach, get_runtime
from sandbox.bwrap import SERVER_BOOT, _root_mounts
from sandbox.inside import SERVER_MODULE, server_argv
from sandbox.singularity import SingularityCommands, SingularityRuntime
from sandbox.spec import SandboxLimits
from sandbox.toolserver import protocol as p
from sandbox.toolserver.output import CappedBuffer, strip_ansi
from sandbox.toolserver.server import parse_args


def test_capped_buffer_keeps_head_and_tail():
    buf = CappedBuffer(100)
    for i in range(1000):
        buf.write(f"{i:04d}\n".encode())
    text = buf.text()
    assert text.startswith("0000\n0001\n") and text.endswith("0999\n")
    assert buf.total == 5000 and buf.elided == 4900
    assert "[... 4900 bytes of output elided ...]" in text
    small = CappedBuffer(100)
    small.write(b"short\r\n")
    assert small.text() == "short\n" and small.elided == 0


def test_strip_ansi():
    assert strip_ansi("\x1b[1;31mred\x1b[0m \x1b]0;title\x07ok\r\n") == "red ok\n"


def test_protocol_rejects_unknown_and_missing_fields():
    assert p.decode(p.BashRequest, {"command": "ls", "timeout": 1}) == p.BashRequest("ls", 1)
    with pytest.raises(p.BadRequest, match="unknown fields"):
        p.decode(p.BashRequest, {"command": "ls", "timeout": 1, "sudo": True})
    with pytest.raises(p.BadRequest):
        p.decode(p.BashRequest, {"command": "ls"})


def test_options_validation():
    with pytest.raises(ValidationError, match="extra"):
        SandboxOptions(memory=1)
    with pytest.raises(ValidationError, match="absolute"):
        SandboxSpec(workspace="relative/dir")
    with pytest.raises(ValidationError, match="absolute"):
        SandboxOptions(workdir="src")
    with pytest.raises(ValidationError):
        SandboxOptions(runtime="docker")
    assert SandboxOptions(runtime="none").runtime == "none"


def test_image_rootfs_mounts(tmp_path):
    for name in ("usr", "etc", "var", "home", "proc", "tmp"):
        (tmp_path / name).mkdir()
    (tmp_path / "bin").symlink_to("usr/bin")
    args = _root_mounts(str(tmp_path))
    assert args == [
        "--symlink",
        "usr/bin",
        "/bin",
        "--ro-bind",
        f"{tmp_path}/etc",
        "/etc",
        "--ro-bind",
        f"{tmp_path}/usr",
        "/usr",
        "--ro-bind",
        f"{tmp_path}/var",
        "/var",
    ]
    host = _root_mounts(None)
    assert "/home" not in host and "/root" not in host and "/var" not in host and "/tmp" not in host


def test_runtime_lookup_errors():
    with pytest.raises(UnknownRuntime, match="no sandbox"):
        get_runtime("none")
    with pytest.raises(SandboxGone, match="lives on node"):
        attach({"node": "elsewhere-" + os.uname().nodename, "socket": "/nonexistent", "id": "x"})


def test_editor_misuse_is_a_model_readable_error(tmp_path):
    from sandbox.toolserver.editor import Editor
    from sandbox.toolserver.protocol import EditRequest, ToolUsage

    editor = Editor(str(tmp_path))
    (tmp_path / "a.txt").write_text("one\ntwo\n")
    with pytest.raises(ToolUsage, match="insert_line` must be an integer"):
        editor.run(EditRequest("insert", "a.txt", insert_line="3", new_str="x"))
    with pytest.raises(ToolUsage, match="view_range"):
        editor.run(EditRequest("view", "a.txt", view_range="1-2"))
    with pytest.raises(ToolUsage, match="Invalid view_range"):
        editor.run(EditRequest("view", "a.txt", view_range=[2, 9]))
    assert "     2\ttwo" in editor.run(EditRequest("view", "a.txt", view_range=[2, -1]))


def test_is_descendant_agrees_with_the_full_process_scan():
    import subprocess
    import time

    from sandbox.toolserver.procs import descendants, is_descendant

    shell = subprocess.Popen(["/bin/sh", "-c", "sleep 30 & sleep 30 & wait"])
    below: list[int] = []
    try:
        end = time.monotonic() + 10
        while len(below := descendants(shell.pid)) < 2 and time.monotonic() < end:
            time.sleep(0.01)
        assert len(below) == 2 and all(is_descendant(pid, shell.pid) for pid in below)
        assert not is_descendant(shell.pid, below[0])  # not upwards
        assert not is_descendant(os.getpid(), shell.pid) and is_descendant(shell.pid, os.getpid())
        assert not is_descendant(2**22 + 1, shell.pid)  # no such process
    finally:
        for pid in below:
            os.kill(pid, 9)
        shell.kill()
        shell.wait()


def test_server_argv_is_what_the_tool_server_parses():
    spec = SandboxSpec(workspace="/ws", workdir="/ws/src")
    argv = server_argv(
        ("python3", *SERVER_MODULE), spec, "/env/bin/python3", socket="/s", ready_fd=7, flags=["--isolate"]
    )
    assert argv[:5] == ["python3", "-s", "-B", "-m", "toolserver"]
    args = parse_args(argv[5:])
    assert (args.socket, args.listen_fd, args.workspace, args.workdir, args.python) == (
        "/s",
        -1,
        "/ws",
        "/ws/src",
        "/env/bin/python3",
    )
    assert (args.ready_fd, args.signal_fd, args.isolate) == (7, -1, True)
    inherited = parse_args(server_argv((), SandboxSpec(workspace="/ws"), "py", listen_fd=3, signal_fd=4))
    assert (inherited.socket, inherited.listen_fd, inherited.signal_fd, inherited.workdir) == (None, 3, 4, "/ws")


def test_bwrap_and_singularity_hand_the_server_the_same_command_line(state_dir, workspace, tmp_path):
    """Both runtimes wrap `server_argv`: the server in each parses to the same settings."""
    spec = SandboxSpec(workspace=workspace, limits=SandboxLimits(output_bytes=1000, file_size_mb=2))
    bwrap = get_runtime("bwrap", state_dir=state_dir).build_argv(spec, {}, None, ["--output-bytes", "1000"])
    fds = {"listen_fd": 3, "ready_fd": 4, "signal_fd": 5}  # what bwrap's launch puts for its placeholders
    bwrap_server = parse_args([a.format(**fds) for a in bwrap[bwrap.index(SERVER_BOOT) + 1 :]])
    singularity = SingularityRuntime(
        state_dir=state_dir, commands=SingularityCommands("apptainer"), image_cache=tmp_path / "cache"
    ).exec_argv(spec, {"instance": "raas-x"}, None)
    singularity_server = parse_args(singularity[singularity.index("toolserver") + 1 :])
    for args in (bwrap_server, singularity_server):
        assert (args.workspace, args.workdir, args.python, args.output_bytes) == (
            workspace,
            workspace,
            "/usr/bin/python3",
            1000,
        )
    assert (bwrap_server.socket, bwrap_server.listen_fd, bwrap_server.ready_fd, bwrap_server.signal_fd) == (
        None,
        3,
        4,
        5,
    )
    assert singularity_server.socket == "/run/raas/tool.sock"


def test_half_written_handles_of_killed_starters_are_swept(tmp_path) -> None:
    """A starter SIGKILLed between writing `<id>.tmp` and renaming it leaves the temp file (its
    intent record may never have become a handle): the sweep removes temps older than a live
    writer could take, never a fresh one, never a handle; `remove_state` takes a handle's."""
    import json
    import os
    import time

    from sandbox.handles import STALE_TEMP_SECONDS, remove_stale_temps, remove_state

    old, fresh, handle = tmp_path / "dead.tmp", tmp_path / "live.tmp", tmp_path / "kept.json"
    for path in (old, fresh, handle):
        path.write_text("{}")
    then = time.time() - STALE_TEMP_SECONDS - 5
    os.utime(old, (then, then))
    os.utime(handle, (then, then))
    assert remove_stale_temps(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json", "live.tmp"]
    remove_state({"handle_file": str(tmp_path / "live.json")})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json"]
    assert json.loads(handle.read_text()) == {}
