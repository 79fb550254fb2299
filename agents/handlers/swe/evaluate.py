"""SWE EVAL in the fresh grading sandbox: apply the test patch, run the listed tests isolated.

The workspace is a clean checkout of the base commit plus the agent's non-test changes (see
`swe_diff`), in a sandbox nothing of the agent's RUN survives into. pytest runs isolated:
`python -I` (no cwd on sys.path, no PYTHON* variables), plugin autoload off, the grader's own
ini (`-c`, so no repo config the agent could have written is read) and rootdir. The JUnit
report goes to an inherited descriptor (fd 3, the tool's output pipe), never to a file: code
under test cannot predict a path to rewrite, and anything it writes to that pipe too makes the
report unparseable. Two channels must agree: every listed test passed in the report *and*
pytest exited 0. The listed tests of each test file run in one interpreter under
`swe_guard.RUNNER`, which fingerprints pytest before the package loads and adds a third channel,
its per-test verdict line (issue 22.4; an instance's own `test_cmd` runs the whole list once,
unguarded). One interpreter per file, not per test: hundreds of ids, each importing the
package, would time correct patches out to reward 0. Mistakes of the
agent (a broken repo, tests that hang) give reward 0; only sandbox failures raise.
"""

from __future__ import annotations

import json
import secrets
import shlex
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

from agents.abstract import EvalResult
from agents.handlers.swe.guard import RUNNER, split_report

# Git run by EVAL must not execute anything the agent configured in the repo.
GIT = (
    "git -c safe.directory='*' -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.pager=cat -c color.ui=false"
)
PYTEST_ARGS = "-p no:cacheprovider -rA --tb=short"
TEST_PATCH = ".git/raas_test.patch"
MAX_REPORT_CHARS = 32 * 1024 * 1024


@dataclass
class SuiteRun:
    """Per-test outcomes of one run of the listed tests."""

    statuses: dict[str, str] = field(default_factory=dict)  # node id -> passed/failed/...
    timed_out: bool = False
    exit_code: int | None = None
    output: str = ""
    replaced: dict[str, list[str]] = field(default_factory=dict)  # test -> pytest objects


def listed_tests(value: Any) -> list[str]:
    """FAIL_TO_PASS / PASS_TO_PASS as a list (SWE-bench stores them as JSON strings)."""
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else []
    return [str(v) for v in value]


def _sh(sb: Any, workspace: str, command: str, timeout: float) -> Any:
    return sb.bash(f"cd {shlex.quote(workspace)} && {command}", timeout=timeout)


def apply_patch(sb: Any, workspace: str, patch: str, name: str, timeout: float = 60) -> str | None:
    """Apply `patch` with git; None on success, else git's complaint."""
    if not patch.strip():
        return None
    sb.write_file(f"{workspace}/{name}", patch if patch.endswith("\n") else patch + "\n")
    result = _sh(sb, workspace, f"{GIT} apply --binary --whitespace=nowarn {name}", timeout)
    return None if result.exit_code == 0 else (result.output.strip()[-2000:] or "git apply failed")


def run_tests(sb: Any, workspace: str, tests: list[str], timeout: float, test_cmd: str | None = None) -> SuiteRun:
    """Run `tests` (pytest node ids), isolated, within one wall-clock limit: the ids of each
    test file in one guarded interpreter, or (an instance's `test_cmd`) all at once."""
    scratch = f"/tmp/.raas-grade-{secrets.token_hex(8)}"
    ini = f"[pytest]\npythonpath = {workspace}\n"
    sb.bash(
        f"mkdir -p {scratch} && printf %s {shlex.quote(ini)} > {scratch}/pytest.ini && "
        f"printf %s {shlex.quote(RUNNER)} > {scratch}/runner.py",
        timeout=30,
    )
    if test_cmd:
        return _run_suite(sb, workspace, tests, timeout, test_cmd, scratch)
    by_file: dict[str, list[str]] = {}
    for test in dict.fromkeys(tests):
        by_file.setdefault(test.split("::")[0], []).append(test)
    run, deadline, consoles = SuiteRun(exit_code=0), time.monotonic() + timeout, []
    for ids in by_file.values():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            run.statuses.update(dict.fromkeys(ids, "missing"))
            run.timed_out = True
            continue
        result = _sh(
            sb,
            workspace,
            f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python3 -I -B "
            f"{scratch}/runner.py -c {scratch}/pytest.ini --rootdir "
            f"{shlex.quote(workspace)} {PYTEST_ARGS} --junitxml=/dev/fd/3 "
            f"{' '.join(shlex.quote(t) for t in ids)} 3>&1 >{scratch}/out 2>&1",
            remaining,
        )
        junit, verdicts = split_report(result.output)
        statuses = match_statuses(ids, parse_junit(junit))
        verdict = verdicts[0] if len(verdicts) == 1 else {"passed": False}
        # the exit status is a channel of its own: 0 exactly when the runner's verdict is
        # that every test of this run passed (1 otherwise; anything else: not the runner's)
        agrees = result.exit_code in (0, 1) and (result.exit_code == 0) == bool(verdict.get("passed"))
        for test in ids:
            status = statuses[test]
            if verdict.get("replaced"):
                run.replaced[test] = verdict["replaced"]
            if status == "passed" and not (agrees and _guard_passed(verdict, test)):
                status = "tampered" if verdict.get("replaced") else "unverified"
            run.statuses[test] = status
        run.timed_out = run.timed_out or result.timed_out
        if result.exit_code != 0 and run.exit_code == 0:
            run.exit_code = result.exit_code
        if any(run.statuses[t] != "passed" for t in ids):
            consoles.append(sb.bash(f"tail -c 1500 {scratch}/out", timeout=30).output)
    sb.bash(f"rm -rf {scratch}", timeout=30)
    run.output = "\n".join(consoles)[-4000:]
    return run


def _guard_passed(verdict: dict[str, Any], test: str) -> bool:
    """The runner's own verdict on `test`: its node id, or every node under it (a class or
    parametrised id), recorded as passed with nothing of pytest replaced."""
    if verdict.get("replaced"):
        return False
    tests = verdict.get("tests")
    if not isinstance(tests, dict):
        return False
    if test in tests:
        return tests[test] is True
    under = [ok for node, ok in tests.items() if node.startswith((test + "::", test + "["))]
    return bool(under) and all(ok is True for ok in under)


def _run_suite(sb: Any, workspace: str, tests: list[str], timeout: float, prefix: str, scratch: str) -> SuiteRun:
    """The whole list in one run of the instance's own command (JUnit on fd 3 + exit 0)."""
    ids = " ".join(shlex.quote(t) for t in tests)
    result = _sh(
        sb,
        workspace,
        f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {prefix} --junitxml=/dev/fd/3 {ids} 3>&1 >{scratch}/out 2>&1",
        timeout,
    )
    console = sb.bash(f"tail -c 4000 {scratch}/out; rm -rf {scratch}", timeout=30).output
    run = SuiteRun(timed_out=result.timed_out, exit_code=result.exit_code, output=console)
    run.statuses = match_statuses(tests, parse_junit(result.output))
    return run


def parse_junit(xml: str) -> dict[tuple[str, str], str]:
    """{(classname, name): status} from exactly one pytest JUnit document, else {}."""
    xml = xml.strip()
    if not xml.startswith("<?xml") or len(xml) > MAX_REPORT_CHARS or "<!DOCTYPE" in xml:
        return {}
    try:
        root = ET.fromstring(xml)  # trailing or interleaved writes make this fail
    except ET.ParseError:
        return {}
    statuses = {}
    for case in root.iter("testcase"):
        status = "passed"
        for child, label in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            if case.find(child) is not None:
                status = label
                break
        statuses[(case.get("classname", ""), case.get("name", ""))] = status
    return statuses


def _junit_key(node_id: str) -> tuple[str, str]:
    """pytest's JUnit (classname, name) for a node id like `tests/test_a.py::TestX::test_y`."""
    path, *rest = node_id.split("::")
    module = path[:-3] if path.endswith(".py") else path
    classname = ".".join([module.replace("/", "."), *rest[:-1]])
    return classname, rest[-1] if rest else ""


def match_statuses(tests: list[str], report: dict[tuple[str, str], str]) -> dict[str, str]:
    """Status of each requested node id; a test absent from the report is 'missing'."""
    return {test: report.get(_junit_key(test), "missing") for test in tests}


def grade(instance: dict[str, Any], workspace: str, sb: Any, timeout: float) -> EvalResult:
    """Apply the test patch, run FAIL_TO_PASS + PASS_TO_PASS, reward 1 iff all passed."""
    f2p, p2p = listed_tests(instance["FAIL_TO_PASS"]), listed_tests(instance["PASS_TO_PASS"])
    metrics: dict[str, Any] = {"f2p_total": len(f2p), "p2p_total": len(p2p)}
    extra: dict[str, Any] = {}
    problem = apply_patch(sb, workspace, instance["test_patch"], TEST_PATCH)
    metrics["test_patch_applied"] = problem is None
    if problem is not None:
        extra["eval_error"] = f"test patch did not apply: {problem}"
        return EvalResult(0.0, {**metrics, "f2p_passed": 0, "p2p_passed": 0, "resolved": False}, extra)
    run = run_tests(sb, workspace, f2p + p2p, timeout, instance.get("test_cmd"))
    passed = {t for t, s in run.statuses.items() if s == "passed"}
    metrics.update(
        f2p_passed=len(passed & set(f2p)),
        p2p_passed=len(passed & set(p2p)),
        tests_timed_out=run.timed_out,
        tests_exit_code=run.exit_code,
    )
    extra.update(test_results=run.statuses, test_output=run.output)
    if run.replaced:
        extra["pytest_replaced"] = run.replaced
        metrics["runner_tampering"] = True
    resolved = set(f2p + p2p) <= passed and run.exit_code == 0
    metrics["resolved"] = resolved
    return EvalResult(1.0 if resolved else 0.0, metrics, extra)
