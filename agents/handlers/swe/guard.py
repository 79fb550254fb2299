"""Grading swe tests so the package under test cannot simply rewrite pytest's verdict.

Two defences (issue 22.4), both in EVAL's fresh sandbox:

1. **One interpreter per test file, pytest fingerprinted before the package loads.**
   `RUNNER` (written into the sandbox, run as `python3 -I -B runner.py`) imports pytest, every
   `_pytest` module and pluggy first, keeps a reference to each of their functions, classes and
   class members, then runs the file's listed test ids with a plugin that records, per node id,
   the call phase and every phase's report itself. After the run it checks that every recorded
   object is still in place (and every module still in `sys.modules`), and writes one verdict
   line after pytest's JUnit report on the grader's pipe (fd 3): per-test verdicts, the exit
   code, what was replaced. A test passes only if the JUnit report parses and says passed, the
   verdict says that test passed with nothing replaced in its interpreter, and the exit status
   agrees with the verdict (0 iff every test of the run passed). One interpreter per file, not
   per test: SWE-bench lists run to hundreds of ids, and a package import per id would push
   correct patches past the test timeout to reward 0 (review 1 item 3).
2. **A scan of the graded diff** (`scan_runner_refs`, on by default, per job): added lines of
   the agent's non-test changes that name test-runner internals (`_pytest`, pytest hooks,
   pluggy, `sys.modules`, unittest result classes, `atexit`, `os._exit`) earn reward 0 without
   running anything.

What this cannot stop is code that targets this grader in particular: it runs in the same
process as the verdict, so it can, in principle, find and patch the runner's own objects or
write a forged report and verdict in the same shape. The scan catches the plain forms of that
too; obfuscated ones (names built at run time) it does not. See docs/security.md.
"""

from __future__ import annotations

import json
import re
from typing import Any

VERDICT = "RAAS-GRADE-VERDICT "
RUNNER = r"""
import importlib, json, os, pkgutil, sys, types
import pluggy, pytest, _pytest
for _m in pkgutil.iter_modules(_pytest.__path__, "_pytest."):
    try:
        importlib.import_module(_m.name)
    except Exception:
        pass
KINDS = (types.FunctionType, type, classmethod, staticmethod, property)


def snapshot():
    held = {}
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name in ("pytest", "pluggy") or name.startswith(("_pytest.", "pluggy."))):
            continue
        held[("module", name)] = mod
        for attr, value in list(vars(mod).items()):
            if isinstance(value, KINDS):
                held[(name, attr)] = value
                if isinstance(value, type) and value.__module__ == name:
                    for key, member in list(vars(value).items()):
                        if isinstance(member, KINDS):
                            held[(name, attr, key)] = member
    return held


def replaced(held):
    out = []
    for key, value in held.items():
        if key[0] == "module":
            now = sys.modules.get(key[1])
        else:
            owner = sys.modules.get(key[0])
            now = getattr(owner, key[1], None) if owner is not None else None
            if len(key) == 3:
                now = vars(now).get(key[2]) if isinstance(now, type) else None
        if now is not value:
            out.append(".".join(key[1:] if key[0] == "module" else key))
    return out


class Guard:
    def __init__(self):
        self.calls, self.reports = {}, {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        result = yield
        info = getattr(result, "excinfo", None) or getattr(result, "_excinfo", None)
        self.calls.setdefault(item.nodeid, []).append(info is None)

    def pytest_runtest_logreport(self, report):
        self.reports.setdefault(report.nodeid, []).append(report.outcome == "passed")


HELD = snapshot()
guard = Guard()
code = int(pytest.main(sys.argv[1:], plugins=[guard]))
tampered = replaced(HELD)
tests = {node: (not tampered and bool(guard.calls.get(node)) and all(guard.calls[node])
                and all(ok))
         for node, ok in guard.reports.items()}
passed = code == 0 and not tampered and bool(tests) and all(tests.values())
verdict = {"passed": passed, "exit": code, "tests": tests, "replaced": tampered[:20]}
os.write(3, ("\n" + "RAAS-GRADE-VERDICT " + json.dumps(verdict) + "\n").encode())
os._exit(0 if passed else 1)
"""

# Added lines of library code that name test-runner internals (issue 22.4's list).
RUNNER_REFS = re.compile(
    r"\b_pytest\b|\bpytest_[a-z_]+\b|\bhookimpl\b|\bhookwrapper\b|\bpluggy\b|\bsys\.modules\b"
    r"|\bunittest\.result\b|\b_?Text(?:Test)?Result\b|\bTestResult\b|\bTextTestRunner\b"
    r"|\batexit\b|\bos\._exit\b|\bjunitxml\b"
)


def split_report(output: str) -> tuple[str, list[dict[str, Any]]]:
    """(the JUnit text, every verdict line) of one guarded run's fd-3 output."""
    lines, verdicts, rest = output.split("\n"), [], []
    for line in lines:
        if line.startswith(VERDICT):
            try:
                verdicts.append(json.loads(line[len(VERDICT) :]))
            except ValueError:
                verdicts.append({"passed": False, "unreadable": line[:200]})
        else:
            rest.append(line)
    return "\n".join(rest), verdicts


def runner_refs(changes: dict[str, dict[str, Any]], base_text: Any) -> list[dict[str, Any]]:
    """Lines the agent added to kept files that name test-runner internals:
    [{path, line, match}]; `base_text(path)` gives the clean file's text ("" when new)."""
    found = []
    for path, change in sorted(changes.items()):
        if not path.endswith((".py", ".pyi", ".pth", ".cfg", ".toml", ".ini")):
            continue
        text = change.get("text")
        if text is None:
            continue
        old = set(base_text(path).splitlines())
        for number, line in enumerate(str(text).splitlines(), 1):
            if line in old:
                continue
            match = RUNNER_REFS.search(line)
            if match:
                found.append({"path": path, "line": number, "match": match.group(0)})
    return found[:50]
