"""Start a long-running program in a sandbox, detached (standalone: stdlib only, by path).

`python3 -I -S detach.py --status FILE --log FILE --cwd DIR [--env K=V ...] -- ARGV...`
forks a supervisor in a session of its own, which runs ARGV (found on PATH; no shell) in a
process group of its own with the caller's environment plus the `--env` variables, stdout and
stderr to the log; ARGV's pid is printed (`kill -- -PID` stops its group), and the supervisor
writes `{"returncode": N}` to the status file when it ends (negative: killed by that signal). The
tool call that started it returns at once, so the host polls the status file between
cancel and deadline checks instead of holding one tool call for the program's whole run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def spawn(args: argparse.Namespace, command: list[str]) -> int:
    """Fork the command in a process group of its own (its pid is the group id)."""
    env = dict(os.environ)
    for item in args.env:
        name, _, value = item.partition("=")
        env[name] = value
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            os.chdir(args.cwd)
            log = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.execvpe(command[0], command, env)
        except OSError as exc:
            os.write(2, f"detach: cannot start {command[0]!r}: {exc}\n".encode())
        os._exit(127)
    try:  # the group exists before the pid is printed: a caller's `kill -- -PID` cannot miss it
        os.setpgid(pid, pid)
    except OSError:  # the child has exec'd already (EACCES), so it made its group itself
        pass
    return pid


def main(argv: list[str]) -> None:
    """Print the program's pid, then supervise it in the background."""
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="detach")
    parser.add_argument("--status", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--cwd", required=True)
    parser.add_argument("--env", action="append", default=[])
    args = parser.parse_args(argv[:split])
    command = argv[split + 1 :]
    if not command:
        parser.error("no command after --")
    read, write = os.pipe()
    if os.fork():  # the caller: print the program's pid (= its group) once it exists, return
        os.close(write)
        sys.stdout.write(os.read(read, 64).decode())
        sys.stdout.flush()
        os._exit(0)
    os.close(read)
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    pid = spawn(args, command)
    os.write(write, f"{pid}\n".encode())
    os.close(write)
    _, status = os.waitpid(pid, 0)
    temp = args.status + ".part"
    with open(temp, "w") as handle:
        json.dump({"returncode": os.waitstatus_to_exitcode(status)}, handle)
    os.replace(temp, args.status)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
