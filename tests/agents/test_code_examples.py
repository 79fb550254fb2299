"""Every example code problem is gradable: no solution scores 0, the reference scores 1.

Through the handler's real EVAL (hidden tests copied in one by one, each in its own process
with a timeout) in a real bwrap sandbox.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.handlers.code.handler import CodeConfig, CodeHandler, load_instances

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "code.jsonl"
INSTANCES = load_instances(str(EXAMPLES))


def test_example_set_shape() -> None:
    assert len(INSTANCES) >= 20
    assert len({i["instance_id"] for i in INSTANCES}) == len(INSTANCES)
    for instance in INSTANCES:
        CodeHandler().validate_instance(instance)
        assert instance["reference_solution"] and len(instance["hidden_tests"]) >= 3


@pytest.mark.parametrize("instance", INSTANCES, ids=[i["instance_id"] for i in INSTANCES])
def test_reference_solution_passes_hidden_tests(instance, make_ctx, make_sandbox, tmp_path) -> None:
    handler = CodeHandler()
    ctx = make_ctx(
        stage="init", instance=instance, workspace=str(tmp_path), agent_config=CodeConfig(reward="all_or_nothing")
    )
    handler.init(ctx)
    ctx = make_ctx(stage="eval", after=ctx, sandbox=make_sandbox(str(tmp_path)))

    empty = handler.evaluate(ctx)
    assert empty.reward == 0.0 and empty.metrics["tests_passed"] == 0

    ctx.sandbox.write_file(f"{tmp_path}/solution.py", instance["reference_solution"])
    graded = handler.evaluate(ctx)
    assert graded.reward == 1.0, graded.extra
    assert graded.metrics["tests_passed"] == len(instance["hidden_tests"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["solution.py"]  # tests removed
