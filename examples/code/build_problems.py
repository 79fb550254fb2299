"""Source of examples/code.jsonl: coding problems with hidden tests and reference solutions.

Each problem: a statement naming the function to write in `solution.py` (or, for the `io-`
problems, a program reading stdin), a reference solution, and hidden tests in the graded format
(`agents/handlers/code/grading.py`): assert snippets written here are turned into
`{call, expected}` tests, others are given as `{setup, call, expected | raises}` or
`{input, output}`. Each runs in its own process; values and outputs are compared on the host. Run
`.venv/bin/python examples/code/build_problems.py` after
editing; tests/agents/test_code_examples.py checks every reference solution through real EVAL.
"""

from __future__ import annotations

import json
from pathlib import Path

# the problems are data modules beside this script (run as a script, its folder is on sys.path)
from function_problems import PROBLEMS as FUNCTION_PROBLEMS
from io_problems import IO_PROBLEMS
from number_problems import NUMBER_PROBLEMS

PROBLEMS = FUNCTION_PROBLEMS + NUMBER_PROBLEMS + IO_PROBLEMS
OUT = Path(__file__).resolve().parents[1] / "code.jsonl"


def as_test(test: str | dict, number: int) -> dict:
    """A hidden test in the graded format: assert snippets become call/expected tests."""
    from agents.handlers.code.grading import normalize_tests

    if isinstance(test, dict):
        return {"name": f"test_{number}", **test}
    typed = normalize_tests([test])[0]
    return {"name": f"test_{number}", "call": typed["call"], "expected": typed["expected"]}


def main() -> int:
    """Write examples/code.jsonl (one instance per problem)."""
    lines = []
    for problem in PROBLEMS:
        lines.append(
            json.dumps(
                {
                    "instance_id": f"code-{problem['id']}",
                    "problem_statement": problem["statement"],
                    "solution_file": "solution.py",
                    "hidden_tests": [as_test(test, i) for i, test in enumerate(problem["tests"], start=1)],
                    "reference_solution": problem["solution"],
                }
            )
        )
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} problems to {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
