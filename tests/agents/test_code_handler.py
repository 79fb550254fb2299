"""The code handler through INIT -> RUN -> EVAL: real LLM simulator, real loop, real bwrap.

Includes the agent that tries to read its hidden tests during RUN: they are not in the
sandbox, and the host files holding them are not reachable from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents.handlers.code.handler import CodeConfig, CodeHandler, grade_solution
from core.errors import InvalidRequest

REPO = Path(__file__).resolve().parents[2]
SECRET = "assert frobnicate(31337) == 'hidden-marker-7f3a'"
INSTANCE = {
    "instance_id": "code-frobnicate",
    "problem_statement": "Write `frobnicate(n)` returning 'hidden-marker-7f3a' for 31337, and str(n) otherwise.",
    "hidden_tests": [SECRET, "assert frobnicate(1) == '1'", "assert frobnicate(-5) == '-5'"],
}
SOLUTION = "def frobnicate(n):\n    return 'hidden-marker-7f3a' if n == 31337 else str(n)\n"


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def run_episode(make_llm, make_ctx, make_sandbox, grade_artifact, tmp_path, replies, instance=INSTANCE, **config: Any):
    """INIT, RUN and EVAL of one rollout, as the pipeline sequences them."""
    handler = CodeHandler()
    cfg = CodeConfig(**config)
    ctx = make_ctx(
        stage="init", instance=instance, workspace=str(tmp_path), agent_config=cfg, sandbox=make_sandbox(str(tmp_path))
    )
    handler.init(ctx)
    ctx = make_ctx(stage="run", after=ctx, llm=make_llm({"default": replies}))
    run = handler.run(ctx)
    # RUN's sandbox killed, fresh one grades
    return ctx, run, grade_artifact(handler, ctx, run_result=run)


def test_agent_cannot_read_hidden_tests_and_a_correct_solution_scores_one(
    make_llm, make_ctx, make_sandbox, grade_artifact, tmp_path
) -> None:
    examples = REPO / "examples" / "code.jsonl"
    snooping = " ; ".join(
        [
            f"cat {examples}",
            f"ls {REPO}",
            "ls -a . /tmp",
            "find / -xdev -name '*.jsonl' 2>/dev/null | head",
            # the pattern matches the secret test but not this command line (kept in /tmp)
            "grep -rlE 'frobnicate[(]3133[7]' / --exclude-dir=proc --exclude-dir=sys "
            "--exclude-dir=dev --exclude-dir=usr 2>/dev/null | grep -v solution.py | wc -l",
            "echo SNOOP-DONE",
        ]
    )
    replies = [
        call("str_replace_editor", command="create", path="solution.py", file_text=SOLUTION),
        call("bash", command=snooping),
        call("bash", command="python3 -c 'from solution import frobnicate; print(frobnicate(2))'"),
        call("submit"),
    ]
    ctx, run, result = run_episode(make_llm, make_ctx, make_sandbox, grade_artifact, tmp_path, replies)
    assert (run.outcome, run.finish_reason) == ("completed", "finish")
    observations = [t["observation"] or "" for t in ctx.turns_recorded]
    assert "SNOOP-DONE" in observations[1]
    assert "No such file or directory" in observations[1]
    assert "31337" not in observations[1]  # the secret assertion is nowhere to be found
    assert "\n0\nSNOOP-DONE" in observations[1]  # grep over every reachable file: no hit
    assert observations[2].strip() == "2"
    assert result.reward == 1.0 and result.metrics["tests_passed"] == 3
    assert grade_artifact.artifact == {"files": {"solution.py": SOLUTION}}


def test_partial_solution_fraction_vs_all_or_nothing(make_ctx, make_sandbox, tmp_path) -> None:
    sb = make_sandbox(str(tmp_path))
    sb.write_file(f"{tmp_path}/solution.py", "def frobnicate(n):\n    return str(n)\n")
    fraction = grade_solution(sb, str(tmp_path), INSTANCE, CodeConfig())
    strict = grade_solution(sb, str(tmp_path), INSTANCE, CodeConfig(reward="all_or_nothing"))
    assert fraction.reward == pytest.approx(2 / 3) and strict.reward == 0.0
    assert fraction.extra["test_results"] == {"test_1": "failed", "test_2": "passed", "test_3": "passed"}


def test_each_hidden_test_has_its_own_timeout(make_ctx, make_sandbox, tmp_path) -> None:
    sb = make_sandbox(str(tmp_path))
    sb.write_file(f"{tmp_path}/solution.py", "def frobnicate(n):\n    while n < 0:\n        pass\n    return str(n)\n")
    result = grade_solution(sb, str(tmp_path), INSTANCE, CodeConfig(test_timeout=1.5))
    assert result.extra["test_results"] == {"test_1": "failed", "test_2": "passed", "test_3": "timeout"}
    assert result.metrics["tests_timed_out"] == 1


def test_exiting_early_at_import_does_not_pass(make_ctx, make_sandbox, tmp_path) -> None:
    sb = make_sandbox(str(tmp_path))
    sb.write_file(f"{tmp_path}/solution.py", "import os\nos._exit(0)\n")
    assert grade_solution(sb, str(tmp_path), INSTANCE, CodeConfig()).reward == 0.0


def test_printing_a_pass_marker_and_exiting_zero_does_not_pass(make_sandbox, tmp_path) -> None:
    sb = make_sandbox(str(tmp_path))
    sb.write_file(
        f"{tmp_path}/solution.py",
        "import os, sys\nprint('RAAS-TEST-PASSED-' + sys.argv[0])\nprint('{\"value\": true}')\nos._exit(0)\n",
    )
    result = grade_solution(sb, str(tmp_path), INSTANCE, CodeConfig())
    assert result.reward == 0.0 and set(result.extra["test_results"].values()) == {"failed"}


def test_input_output_tests_compare_stdout_on_the_host(make_sandbox, tmp_path) -> None:
    instance = {
        "instance_id": "io",
        "problem_statement": "double it",
        "hidden_tests": [
            {"input": "2\n", "output": "4\n"},
            {"input": "5\n", "output": "10"},
            {"input": "0\n", "output": "0\n"},
        ],
    }
    sb = make_sandbox(str(tmp_path))
    sb.write_file(f"{tmp_path}/solution.py", "print(int(input()) * 2 if input != 0 else 1)\n")
    assert grade_solution(sb, str(tmp_path), instance, CodeConfig()).reward == 1.0
    # the expected output is nowhere in the sandbox: a solution can only print its own answer
    sb.write_file(f"{tmp_path}/solution.py", "import os\nprint(os.listdir('.'), open(0).read())\n")
    result = grade_solution(sb, str(tmp_path), instance, CodeConfig())
    assert result.reward == 0.0


def test_agent_shell_state_does_not_leak_into_grading(make_ctx, make_sandbox, tmp_path) -> None:
    sb = make_sandbox(str(tmp_path))
    sb.write_file(f"{tmp_path}/solution.py", SOLUTION)
    sb.bash(
        "mkdir -p fake && printf '#!/bin/sh\\nexit 1\\n' > fake/python3 && "
        "chmod +x fake/python3 && export PATH=$PWD/fake:$PATH",
        timeout=10,
    )
    assert grade_solution(sb, str(tmp_path), INSTANCE, CodeConfig()).reward == 1.0


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"instance_id": "a", "hidden_tests": ["assert 1"]}, "instance.problem_statement"),
        ({"instance_id": "a", "problem_statement": "x"}, "instance.hidden_tests"),
        ({"instance_id": "a", "problem_statement": "x", "hidden_tests": [{"name": "t"}]}, "instance.hidden_tests[0]"),
        (
            {
                "instance_id": "a",
                "problem_statement": "x",
                "hidden_tests": ["assert f(1) == 1", "import os\nassert f(2) == 2"],
            },
            "instance.hidden_tests[1]",
        ),  # only single asserts can be graded outside the solution
        (
            {"instance_id": "a", "problem_statement": "x", "hidden_tests": [{"call": "f(1)", "expected": "g(1)"}]},
            "instance.hidden_tests[0]",
        ),  # expected values are literals, never code
        (
            {
                "instance_id": "a",
                "problem_statement": "x",
                "hidden_tests": ["assert 1"],
                "solution_file": "../escape.py",
            },
            "instance.solution_file",
        ),
    ],
)
def test_validate_instance_names_the_field(bad: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        CodeHandler().validate_instance(bad)
    assert info.value.details["field"] == field


def test_config_rejects_unknown_fields_and_bad_values() -> None:
    with pytest.raises(ValueError, match="temperature"):
        CodeHandler.Config.model_validate({"temperature": 1})
    with pytest.raises(ValueError, match="reward"):
        CodeHandler.Config.model_validate({"reward": "half"})
    assert CodeHandler.Config.model_validate({}).reward == "fraction"
