"""The swe grader's guard (issue 22.4): the diff scan and the runner's verdict channel.

The runner itself is exercised for real in the battery (tests/agents/test_reward_attacks.py:
an in-process patch of pytest's report factory, plain and with names built at run time).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agents.handlers.swe.guard import RUNNER_REFS, runner_refs, split_report


def test_the_scan_names_added_lines_that_touch_runner_internals() -> None:
    base = {"pkg/core.py": "import os\nimport atexit  # was already here\n"}
    changes = {
        "pkg/core.py": {"text": "import os\nimport atexit  # was already here\nimport _pytest.reports\nx = 1\n"},
        "pkg/util.py": {"text": "import sys\nsys.modules['pytest'] = None\nos._exit(0)\n"},
        "pkg/hooks.py": {"text": "def pytest_runtest_makereport(item, call):\n    pass\n"},
        "pkg/data.bin": {"base64": "AAAA"},
        "README.md": {"text": "atexit is mentioned in prose only\n"},
    }
    found = runner_refs(changes, lambda path: base.get(path, ""))
    assert [(r["path"], r["line"], r["match"]) for r in found] == [
        ("pkg/core.py", 3, "_pytest"),
        ("pkg/hooks.py", 1, "pytest_runtest_makereport"),
        ("pkg/util.py", 2, "sys.modules"),
        ("pkg/util.py", 3, "os._exit"),
    ]  # the line that was in the clean file and non-code files are not flagged


def test_the_scan_leaves_ordinary_fixes_alone() -> None:
    for line in (
        "merged[-1][1] = max(merged[-1][1], end)",
        "import unittest",
        "exit(1)",
        "def test_result(self):",
        "modules = sys.argv",
    ):
        assert RUNNER_REFS.search(line) is None, line
    for line in (
        "import atexit",
        "from unittest.result import TestResult",
        "import pluggy",
        "@pytest.hookimpl(hookwrapper=True)",
    ):
        assert RUNNER_REFS.search(line), line


def test_one_verdict_is_split_from_the_report_and_extra_ones_are_kept() -> None:
    report = '<?xml version="1.0"?><testsuites/>'
    junit, verdicts = split_report(report + '\nRAAS-GRADE-VERDICT {"passed": true}\n')
    assert junit.strip() == report and verdicts == [{"passed": True}]
    _, forged = split_report(
        'RAAS-GRADE-VERDICT {"passed": true}\n'
        + report
        + '\nRAAS-GRADE-VERDICT {"passed": false}\nRAAS-GRADE-VERDICT {bad'
    )
    assert len(forged) == 3 and forged[2]["passed"] is False  # the grader wants exactly one


# -- review 1 item 3: one guarded interpreter per test file, per-test verdicts -------------

ATTACKS = Path(__file__).parent / "attacks"
N_PER_FILE = 60


@pytest.fixture(scope="module")
def pytest_env(built_env) -> str:
    return built_env("pytest", ["pytest"])


def _repo(root: Path, tamper: bool = False) -> list[str]:
    """A package with two test files of N_PER_FILE tests, one of them failing; its ids."""
    (root / "pkg").mkdir()
    init = "VALUE = 1\n" + ((ATTACKS / "pytest_inprocess_hidden.py").read_text() if tamper else "")
    (root / "pkg" / "__init__.py").write_text(init)
    (root / "tests").mkdir()
    ids = []
    for name in ("test_a.py", "test_b.py"):
        body = "from pkg import VALUE\n\n" + "".join(
            f"def test_{i}():\n    assert VALUE == {2 if name == 'test_b.py' and i == 7 else 1}\n"
            for i in range(N_PER_FILE)
        )
        (root / "tests" / name).write_text(body)
        ids += [f"tests/{name}::test_{i}" for i in range(N_PER_FILE)]
    return ids


def test_a_long_list_runs_one_interpreter_per_file_with_per_test_verdicts(tmp_path, make_sandbox, pytest_env) -> None:
    """120 ids in two files grade within a 10 s test timeout (measured here: 0.6 s; one
    interpreter per id took 28 s, so the list timed out and a correct patch earned 0); a
    failing test fails alone, its neighbours in the same interpreter pass."""
    from agents.handlers.swe.evaluate import run_tests

    ws = tmp_path / "repo"
    ws.mkdir()
    ids = _repo(ws)
    sb = make_sandbox(str(ws), python_env=pytest_env)
    started = time.monotonic()
    run = run_tests(sb, str(ws), ids, timeout=10)
    took = time.monotonic() - started
    assert run.timed_out is False, (took, run.output)
    failing = "tests/test_b.py::test_7"
    assert run.statuses[failing] == "failed"
    assert {s for t, s in run.statuses.items() if t != failing} == {"passed"}, run.output
    assert len(run.statuses) == 2 * N_PER_FILE and run.exit_code == 1 and not run.replaced


def test_a_tampered_file_fails_every_test_it_ran(tmp_path, make_sandbox, pytest_env) -> None:
    """The package patches pytest's report factory (names built at run time): pytest reports
    every test passed, failing one included; the fingerprint marks them all tampered."""
    from agents.handlers.swe.evaluate import run_tests

    ws = tmp_path / "repo"
    ws.mkdir()
    ids = _repo(ws, tamper=True)
    sb = make_sandbox(str(ws), python_env=pytest_env)
    run = run_tests(sb, str(ws), ids, timeout=120)
    assert set(run.statuses.values()) == {"tampered"}, run.output
    assert "_pytest.reports.TestReport.from_item_and_call" in run.replaced[ids[0]]
