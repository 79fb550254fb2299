"""SWE EVAL inside the sandbox: capture the agent's diff, apply the test patch, run the tests.

Everything runs in the rollout's sandbox through a fresh shell (`reset()` first, so nothing
the agent left in its shell — a changed PATH, an alias, a background job — affects grading).
Files the test patch touches are restored to the base commit before it is applied, as
SWE-bench does, so an agent that edited the tests cannot break or game the patch. Results
come from pytest's JUnit XML, not from parsing console output that the code under test can
print into. Mistakes of the agent (a broken repo, tests that hang) give reward 0; only
sandbox failures raise.
"""
from __future__ import annotations

import json
import re
import shlex
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

from agents.base import EvalResult

# Git run by EVAL must not execute anything the agent configured in the repo.
GIT = ("git -c safe.directory='*' -c core.hooksPath=/dev/null -c core.fsmonitor=false "
       "-c core.pager=cat -c color.ui=false")
DEFAULT_TEST_CMD = "python3 -m pytest -rA --tb=short -p no:cacheprovider"
AGENT_PATCH = ".git/raas_agent.patch"
TEST_PATCH = ".git/raas_test.patch"
JUNIT = ".git/raas_junit.xml"
_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


@dataclass
class SuiteRun:
    """Per-test outcomes of one run of the listed tests."""

    statuses: dict[str, str] = field(default_factory=dict)  # node id -> passed/failed/...
    timed_out: bool = False
    exit_code: int | None = None
    output: str = ""


def listed_tests(value: Any) -> list[str]:
    """FAIL_TO_PASS / PASS_TO_PASS as a list (SWE-bench stores them as JSON strings)."""
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else []
    return [str(v) for v in value]


def _sh(sb: Any, workspace: str, command: str, timeout: float) -> Any:
    return sb.bash(f"cd {shlex.quote(workspace)} && {command}", timeout=timeout)


def capture_patch(sb: Any, workspace: str, base_commit: str, timeout: float = 60) -> str | None:
    """The agent's changes (tracked, new and deleted files) as a binary git diff; None if git fails."""
    staged = _sh(sb, workspace, f"{GIT} add -A && {GIT} diff --cached --binary "
                 f"{shlex.quote(base_commit)} > {AGENT_PATCH}", timeout)
    if staged.exit_code != 0:
        return None
    return sb.read_file(f"{workspace}/{AGENT_PATCH}")


def apply_patch(sb: Any, workspace: str, patch: str, name: str, timeout: float = 60) -> str | None:
    """Apply `patch` with git; None on success, else git's complaint."""
    if not patch.strip():
        return None
    sb.write_file(f"{workspace}/{name}", patch if patch.endswith("\n") else patch + "\n")
    result = _sh(sb, workspace, f"{GIT} apply --binary --whitespace=nowarn {name}", timeout)
    return None if result.exit_code == 0 else (result.output.strip()[-2000:] or "git apply failed")


def restore_test_files(sb: Any, workspace: str, base_commit: str, test_patch: str,
                       timeout: float = 60) -> None:
    """Put every file the test patch touches back to its base-commit state (or remove it)."""
    paths = sorted({p for pair in _DIFF_HEADER.findall(test_patch) for p in pair})
    for path in paths:
        quoted, base = shlex.quote(path), shlex.quote(base_commit)
        _sh(sb, workspace, f"if {GIT} cat-file -e {base}:{quoted} 2>/dev/null; then "
            f"{GIT} checkout -q {base} -- {quoted}; else rm -rf -- {quoted}; fi", timeout)


def run_tests(sb: Any, workspace: str, tests: list[str], timeout: float,
              test_cmd: str | None = None) -> SuiteRun:
    """Run `tests` (pytest node ids) once, with a wall-clock limit; statuses from JUnit XML."""
    ids = " ".join(shlex.quote(t) for t in tests)
    command = (f"rm -f {JUNIT}; PYTHONDONTWRITEBYTECODE=1 {test_cmd or DEFAULT_TEST_CMD} "
               f"--junitxml={JUNIT} {ids}")
    result = _sh(sb, workspace, command, timeout)
    run = SuiteRun(timed_out=result.timed_out, exit_code=result.exit_code,
                  output=result.output[-4000:])
    try:
        xml = sb.read_file(f"{workspace}/{JUNIT}")
    except Exception:  # noqa: BLE001 - no report (collection crash, timeout): every test failed
        xml = ""
    run.statuses = match_statuses(tests, parse_junit(xml))
    return run


def parse_junit(xml: str) -> dict[tuple[str, str], str]:
    """{(classname, name): status} from a pytest JUnit report ('' gives {})."""
    if not xml.strip():
        return {}
    try:
        root = ET.fromstring(xml)
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


def grade(instance: dict[str, Any], workspace: str, sb: Any, timeout: float,
          patch: str | None = None) -> EvalResult:
    """Apply the test patch to the repo as it is now, run FAIL_TO_PASS + PASS_TO_PASS, reward."""
    base = instance["base_commit"]
    f2p, p2p = listed_tests(instance["FAIL_TO_PASS"]), listed_tests(instance["PASS_TO_PASS"])
    metrics: dict[str, Any] = {"f2p_total": len(f2p), "p2p_total": len(p2p)}
    extra: dict[str, Any] = {"git_patch": patch}
    restore_test_files(sb, workspace, base, instance["test_patch"])
    problem = apply_patch(sb, workspace, instance["test_patch"], TEST_PATCH)
    metrics["test_patch_applied"] = problem is None
    if problem is not None:
        extra["eval_error"] = f"test patch did not apply: {problem}"
        return EvalResult(0.0, {**metrics, "f2p_passed": 0, "p2p_passed": 0}, extra)
    run = run_tests(sb, workspace, f2p + p2p, timeout, instance.get("test_cmd"))
    passed = {t for t, s in run.statuses.items() if s == "passed"}
    metrics.update(f2p_passed=len(passed & set(f2p)), p2p_passed=len(passed & set(p2p)),
                   tests_timed_out=run.timed_out)
    extra.update(test_results=run.statuses, test_output=run.output)
    resolved = set(f2p + p2p) <= passed
    metrics["resolved"] = resolved
    return EvalResult(1.0 if resolved else 0.0, metrics, extra)
