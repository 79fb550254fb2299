"""The Python session's worker process: runs cells with IPython if importable, else exec."""

from __future__ import annotations

import ast
import builtins
import contextlib
import json
import linecache
import os
import signal
import sys
import traceback

from .output import CappedText, strip_ansi


class PlainRunner:
    """exec-based cells: statements, then the repr of a trailing expression."""

    def __init__(self) -> None:
        self.ns: dict = {"__name__": "__main__", "__builtins__": builtins}
        self.count = 0

    def run(self, code: str) -> str | None:
        """Run one cell; returns traceback text or None."""
        self.count += 1
        name = f"<cell-{self.count}>"
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        try:
            tree = ast.parse(code, name, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, name, "exec"), self.ns)
            if last is not None:
                value = eval(compile(last, name, "eval"), self.ns)
                if value is not None:
                    self.ns["_"] = value
                    print(repr(value))
        except BaseException as exc:  # noqa: BLE001 - user errors become text, even SystemExit
            return _format_user_error(exc)
        return None


def _format_user_error(exc: BaseException) -> str:
    """Traceback text without this module's frames."""
    te = traceback.TracebackException.from_exception(exc)
    te.stack = traceback.StackSummary.from_list([frame for frame in te.stack if frame.filename != __file__])
    return "".join(te.format())


class IPythonRunner:
    """IPython InteractiveShell cells (magics, `!cmd`, rich reprs) with tracebacks as text."""

    def __init__(self) -> None:
        from IPython.core.interactiveshell import InteractiveShell

        self.shell = InteractiveShell.instance()
        self.shell.colors = "NoColor"
        self.shell.separate_out = ""
        self.shell.displayhook.write_output_prompt = lambda: None  # plain repr, no "Out[n]:"
        self.errors: list[str] = []
        self.shell._showtraceback = self._collect  # keeps tracebacks out of stdout

    def _collect(self, etype, evalue, stb) -> None:  # untyped: IPython's signature
        self.errors.append(self.shell.InteractiveTB.stb2text(stb))

    def run(self, code: str) -> str | None:
        """Run one cell; returns traceback text or None."""
        self.errors.clear()
        result = self.shell.run_cell(code, store_history=True)
        if self.errors:
            return strip_ansi("\n".join(self.errors))
        error = result.error_before_exec or result.error_in_exec
        return None if error is None else f"{type(error).__name__}: {error}"


def _make_runner():
    try:
        return IPythonRunner()
    except ImportError:
        return PlainRunner()


def main() -> None:
    """Serve cells over private copies of stdin/stdout; user output never touches them."""
    ctl_in = os.fdopen(os.dup(0), "r", encoding="utf-8")
    ctl_out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 65536
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # never interrupt the control channel
    runner = _make_runner()
    ctl_out.write(json.dumps({"ready": type(runner).__name__}) + "\n")
    ctl_out.flush()
    for line in ctl_in:
        code = json.loads(line)["code"]
        out = CappedText(limit)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            signal.signal(signal.SIGINT, signal.default_int_handler)  # C handler: no extra frame
            try:
                error = runner.run(code)
            except KeyboardInterrupt:
                error = "KeyboardInterrupt"
            finally:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
        ctl_out.write(json.dumps({"output": out.text(), "error": error}) + "\n")
        ctl_out.flush()
