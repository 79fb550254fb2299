"""The public sandbox API on real bwrap and local sandboxes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from sandbox import (
    SandboxGone,
    SandboxTimeout,
    ToolUsageError,
    UnknownRuntime,
    attach,
    get_runtime,
    list_sandboxes,
    stop_handle,
)
from tests.sandbox.conftest import host_processes_matching

PY = sys.executable


def test_bash_keeps_state_and_reports_exit_codes(sb):
    assert sb.bash("mkdir -p src && touch src/x && cd src && export FOO=bar").exit_code == 0
    r = sb.bash("pwd; ls; echo $FOO")
    assert r.output == f"{sb.workspace}/src\nx\nbar\n" and r.exit_code == 0 and not r.timed_out
    assert sb.bash("false").exit_code == 1
    assert sb.bash("(exit 7)").exit_code == 7


def test_bash_heredoc_long_input_and_quotes(sb):
    r = sb.bash("cat <<'EOF'\n$HOME 'single' \"double\" !bang\nEOF")
    assert r.output == "$HOME 'single' \"double\" !bang\n"
    long_line = "x" * 100_000  # far past the pty's 4 KiB line buffer
    assert sb.bash(f"echo {long_line} | wc -c").output.strip() == "100001"
    r = sb.bash("echo 'unterminated")
    assert r.exit_code != 0 and "unexpected EOF" in r.output
    assert sb.bash("echo still-fine").output == "still-fine\n"


def test_bash_pager_ansi_and_history_expansion(sb):
    assert sb.bash("echo $PAGER $GIT_PAGER").output == "cat cat\n"
    assert sb.bash(r"printf '\033[1;31mred\033[0m\n'").output == "red\n"
    assert sb.bash("echo hi!!").output == "hi!!\n"


def test_bash_timeout_is_a_result_and_the_shell_survives(sb):
    sb.bash("cd /tmp && export KEEP=1")
    started = time.monotonic()
    r = sb.bash("echo partial; sleep 1000", timeout=1)
    assert r.timed_out and r.exit_code is None and "partial" in r.output
    assert time.monotonic() - started < 6
    assert sb.bash("pwd; echo $KEEP").output == "/tmp\n1\n"  # interrupted, not restarted


def test_bash_exit_restarts_the_shell(sb):
    r = sb.bash("exit 3")
    assert r.exit_code == 3
    assert sb.bash("echo back").output == "back\n"


def test_python_session(sb):
    p = sb.python("import math\nx = 21\nmath.pi")
    assert p.output == "3.141592653589793\n" and p.error is None
    assert sb.python("print('out'); x * 2").output == "out\n42\n"
    p = sb.python("print('before'); 1/0")
    assert p.output == "before\n" and "ZeroDivisionError" in p.error
    p = sb.python("import time; time.sleep(100)", timeout=1)
    assert p.timed_out and "KeyboardInterrupt" in p.error
    assert sb.python("x").output == "21\n"  # interrupted, state kept


def test_file_tools(sb):
    sb.write_file("pkg/a.py", "def f():\n    return 1\n")
    assert sb.read_file("pkg/a.py") == "def f():\n    return 1\n"
    assert sb.bash("cat pkg/a.py").output == "def f():\n    return 1\n"
    view = sb.edit("view", "pkg/a.py")
    assert "     1\tdef f():" in view and "     2\t    return 1" in view
    out = sb.edit("str_replace", "pkg/a.py", old_str="return 1", new_str="return 2")
    assert "return 2" in out and sb.read_file("pkg/a.py").endswith("return 2\n")
    sb.edit("insert", "pkg/a.py", insert_line=0, new_str="import os")
    assert sb.read_file("pkg/a.py").startswith("import os\ndef f")
    sb.edit("undo_edit", "pkg/a.py")
    assert sb.read_file("pkg/a.py") == "def f():\n    return 2\n"
    assert "File created" in sb.edit("create", "b.txt", file_text="one\none\n")
    assert f"{sb.workspace}/pkg/a.py" in sb.edit("view", ".")
    with pytest.raises(ToolUsageError, match="Multiple occurrences"):
        sb.edit("str_replace", "b.txt", old_str="one", new_str="two")
    with pytest.raises(ToolUsageError, match="did not appear verbatim"):
        sb.edit("str_replace", "b.txt", old_str="zzz", new_str="two")
    with pytest.raises(ToolUsageError, match="already exists"):
        sb.edit("create", "b.txt", file_text="x")
    with pytest.raises(ToolUsageError, match="Unknown command"):
        sb.edit("delete", "b.txt")
    with pytest.raises(ToolUsageError, match="does not exist"):
        sb.read_file("missing.txt")


def test_attach_from_another_process_and_outlive_the_starter(state_dir, workspace):
    starter = (
        "import json, sys; from sandbox import get_runtime, SandboxSpec;"
        f"sb = get_runtime(sys.argv[1], state_dir={state_dir!r}).start("
        f"SandboxSpec(workspace={workspace!r}), label='r-attach:1');"
        "sb.bash('export MARK=from-init'); print(json.dumps(sb.handle))"
    )
    for runtime in ("bwrap", "local"):
        out = subprocess.run([PY, "-c", starter, runtime], check=True, capture_output=True, text=True)
        handle = json.loads(out.stdout)  # the starting process has exited by now
        user = (
            "import json, sys; from sandbox import attach;"
            "sb = attach(json.loads(sys.argv[1])); print(sb.bash('echo $MARK').output, end='')"
        )
        used = subprocess.run([PY, "-c", user, json.dumps(handle)], check=True, capture_output=True, text=True)
        assert used.stdout == "from-init\n"
        assert [h["label"] for h in list_sandboxes(state_dir)] == ["r-attach:1"]
        sb = attach(handle)
        assert sb.bash("echo $MARK").output == "from-init\n"
        sb.stop()
        assert list_sandboxes(state_dir) == []
        with pytest.raises(SandboxGone):
            attach(handle)


def test_stop_kills_everything_and_is_idempotent(start):
    for runtime in ("bwrap", "local"):
        sb = start(runtime)
        tag = f"{1000 + len(runtime)}.{os.getpid()}"
        sb.bash(f"sleep {tag} & nohup sleep {tag} >/dev/null 2>&1 & disown; setsid sleep {tag} &")
        sb.python(f"import subprocess; subprocess.Popen(['sleep', '{tag}'])")
        time.sleep(0.2)
        assert len(host_processes_matching(f"sleep\0{tag}")) == 4
        sb.stop()
        assert host_processes_matching(f"sleep\0{tag}") == []
        sb.stop()  # idempotent
        stop_handle(sb.handle)
        with pytest.raises(SandboxGone):
            sb.bash("echo hi")


def test_stop_handle_works_when_the_server_hangs(start):
    for runtime in ("bwrap", "local"):
        sb = start(runtime)
        server = sb.ping().pid if runtime == "local" else None
        if runtime == "bwrap":  # find the server: the init's child inside the namespace
            init = sb.handle["init_pid"]
            server = int(open(f"/proc/{init}/task/{init}/children").read().split()[0])
        os.kill(server, signal.SIGSTOP)
        while open(f"/proc/{server}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
            time.sleep(0.01)  # signal delivery is asynchronous
        with pytest.raises(SandboxTimeout):
            sb.ping(timeout=0.5)
        started = time.monotonic()
        stop_handle(sb.handle)
        assert time.monotonic() - started < 5
        assert list_sandboxes(sb.handle["handle_file"].rsplit("/", 1)[0]) == []


def test_runtime_registry():
    with pytest.raises(UnknownRuntime, match="valid: auto, none, bwrap, local, singularity"):
        get_runtime("docker")
    assert get_runtime("auto").name == "bwrap"


def test_unknown_editor_parameter_is_a_tool_usage_error(start):
    sb = start("bwrap")
    with pytest.raises(ToolUsageError, match="Unknown parameter"):
        sb.edit("create", "x.txt", content="hi")


def test_shell_survives_the_agent_wiping_tmp(start):
    sb = start("bwrap")
    sb.bash("rm -rf /tmp/* /tmp/.[!.]*")
    assert sb.bash("echo fine").output == "fine\n"


def test_dead_sandboxes_are_pruned_from_the_listing(start, state_dir):
    sb = start("bwrap", label="doomed:0")
    os.kill(sb.handle["init_pid"], signal.SIGKILL)  # the sandbox dies behind our back
    time.sleep(0.2)
    assert list_sandboxes(state_dir) == []
    assert not os.path.exists(sb.handle["handle_file"])
    assert all(not os.path.exists(path) for path in sb.handle["cgroups"])
