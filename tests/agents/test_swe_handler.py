"""The swe handler through INIT -> RUN -> EVAL (LLM simulator, shared loop, real bwrap),
EVAL as the pipeline runs it (artifact from the dead workspace, a fresh grading sandbox),
re-grading of stored artifacts, grading that agents cannot game, and repo sources.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from agents.handlers.swe import diff as swe_diff
from agents.handlers.swe.handler import SWEConfig, SWEHandler
from agents.handlers.swe.repo import git_env, materialize
from core.errors import InvalidRequest

REPO = Path(__file__).resolve().parents[2]
INSTANCES = {
    json.loads(line)["instance_id"].split("__")[1].rsplit("-", 1)[0]: json.loads(line)
    for line in (REPO / "examples/swe/instances.jsonl").read_text().splitlines()
}
INTERVALS = INSTANCES["intervals"]
BUGGY = "            merged[-1][1] = end\n"
FIXED = "            merged[-1][1] = max(merged[-1][1], end)\n"


@pytest.fixture(scope="module")
def pytest_env(built_env) -> str:
    return built_env("pytest", ["pytest"])


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def episode(
    make_llm,
    make_ctx,
    make_sandbox,
    grade_artifact,
    tmp_path: Path,
    env: str,
    replies: list[str],
    instance: dict = INTERVALS,
    **config: Any,
):
    """INIT, RUN and EVAL of one rollout, sequenced as the pipeline does."""
    handler = SWEHandler()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    ctx = make_ctx(
        stage="init",
        instance=instance,
        workspace=str(workspace),
        agent_config=SWEConfig(**config),
        limits={"tool_timeout": 20},
    )
    handler.init(ctx)
    ctx = make_ctx(
        stage="run",
        after=ctx,
        sandbox=make_sandbox(str(workspace), python_env=env),
        llm=make_llm({"default": replies}, max_model_len=8192),
    )
    run = handler.run(ctx)
    return ctx, run, grade_artifact(handler, ctx, {"python_env": env}, run_result=run)


def test_agent_fixes_the_bug_and_gets_reward_one(
    make_llm, make_ctx, make_sandbox, tmp_path, grade_artifact, pytest_env
) -> None:
    replies = [
        call("bash", command="git status --short && ls intervals"),
        call("str_replace_editor", command="view", path="intervals/core.py"),
        call("str_replace_editor", command="str_replace", path="intervals/core.py", old_str=BUGGY, new_str=FIXED),
        call("bash", command="python3 -c 'from intervals import merge; print(merge([(1, 10), (2, 3)]))'"),
        call("submit"),
    ]
    ctx, run, result = episode(make_llm, make_ctx, make_sandbox, grade_artifact, tmp_path, pytest_env, replies)
    assert (run.outcome, run.finish_reason, run.metrics["turns"]) == ("completed", "finish", 5)
    observations = [t["observation"] for t in ctx.turns_recorded]
    assert "core.py" in observations[0]
    assert "def merge" in observations[1]
    assert observations[3].strip() == "[(1, 10)]"
    assert result.reward == 1.0, result.extra
    artifact = grade_artifact.artifact
    assert list(artifact["files"]) == ["intervals/core.py"]  # no caches, no .git
    assert "+            merged[-1][1] = max(merged[-1][1], end)" in result.extra["git_patch"]
    assert result.metrics["f2p_passed"] == 3 and result.metrics["resolved"] is True

    # The stored artifact grades the same again (re-evaluation); no changes grade 0.
    handler = SWEHandler()
    again = grade_artifact(handler, ctx, {"python_env": pytest_env}, artifact=artifact)
    assert again.reward == 1.0
    assert grade_artifact(handler, ctx, {"python_env": pytest_env}, artifact={"files": {}}).reward == 0.0


def test_the_artifact_never_follows_links_or_reads_fifos(tmp_path) -> None:
    clean, agent = tmp_path / "clean", tmp_path / "agent"
    materialize(INTERVALS["repo"], INTERVALS["base_commit"], clean)
    materialize(INTERVALS["repo"], INTERVALS["base_commit"], agent)
    secret = tmp_path / "host-secret.txt"
    secret.write_text("hunter2")
    (agent / "leak.txt").symlink_to(secret)
    (agent / "intervals" / "core.py").unlink()
    (agent / "intervals" / "core.py").symlink_to(secret)
    (agent / "linked-dir").symlink_to(tmp_path)
    import os

    os.mkfifo(agent / "pipe")
    (agent / "__pycache__").mkdir()
    (agent / "__pycache__" / "x.pyc").write_bytes(b"\0")
    changes = swe_diff.workspace_changes(str(agent), str(clean))
    assert changes["files"] == {}  # nothing read through a link, the fifo never opened
    assert set(changes["skipped"]) == {"leak.txt", "intervals/core.py", "linked-dir", "pipe"}
    assert "hunter2" not in json.dumps(changes)


def test_test_infrastructure_is_dropped_before_grading() -> None:
    changes = {
        p: {"text": "x"}
        for p in (
            "intervals/core.py",
            "tests/test_core.py",
            "conftest.py",
            "sub/conftest.py",
            "pytest.ini",
            "setup.cfg",
            "pyproject.toml",
            "tox.ini",
            "sitecustomize.py",
            "evil.pth",
            "pytest.py",
            "json.py",
            "unittest/__init__.py",
            "intervals/new_helper.py",
            ".git/config",
            "../outside.py",
        )
    }
    kept, dropped = swe_diff.split_changes(changes, {"intervals/core.py", "tests/test_core.py"}, {"tests/test_core.py"})
    assert sorted(kept) == ["intervals/core.py", "intervals/new_helper.py"]
    assert dropped["tests/test_core.py"] == "touched by test_patch"
    assert dropped["pytest.py"].startswith("new module shadowing")
    assert len(dropped) == len(changes) - 2


def test_editing_the_tests_instead_of_the_code_earns_nothing(
    make_llm, make_ctx, make_sandbox, grade_artifact, tmp_path, pytest_env
) -> None:
    # The agent rewrites the FAIL_TO_PASS tests' file so everything it can see passes.
    replies = [
        call("bash", command="printf 'def test_merge_contained_interval():\\n    pass\\n' > tests/test_core.py"),
        call(
            "bash",
            command="mkdir -p fake && printf '#!/bin/sh\\nexit 0\\n' > "
            "fake/python3 && chmod +x fake/python3 && "
            "export PATH=$PWD/fake:$PATH",
        ),
        call("submit"),
    ]
    _, run, result = episode(make_llm, make_ctx, make_sandbox, grade_artifact, tmp_path, pytest_env, replies)
    assert run.finish_reason == "finish"
    assert result.reward == 0.0 and result.extra["dropped_files"] == ["tests/test_core.py"]
    assert result.metrics["f2p_passed"] == 0
    assert result.metrics["p2p_passed"] == result.metrics["p2p_total"]  # test file restored


def test_hanging_tests_hit_the_eval_timeout(
    make_llm, make_ctx, make_sandbox, grade_artifact, tmp_path, pytest_env
) -> None:
    replies = [
        call(
            "str_replace_editor",
            command="str_replace",
            path="intervals/core.py",
            old_str="    merged = []\n",
            new_str="    merged = []\n    while True:\n        pass\n",
        ),
        call("submit"),
    ]
    _, _, result = episode(
        make_llm, make_ctx, make_sandbox, grade_artifact, tmp_path, pytest_env, replies, test_timeout=3
    )
    assert result.reward == 0.0 and result.metrics["tests_timed_out"] is True


def test_an_agent_that_never_acts_is_agent_error_and_scores_zero(
    make_llm, make_ctx, make_sandbox, grade_artifact, tmp_path, pytest_env
) -> None:
    _, run, result = episode(
        make_llm,
        make_ctx,
        make_sandbox,
        grade_artifact,
        tmp_path,
        pytest_env,
        ["I will not use tools."],
        max_invalid_turns=2,
    )
    assert (run.outcome, run.finish_reason) == ("agent_error", "no_valid_action")
    assert result.reward == 0.0 and result.extra["git_patch"] == ""


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, env=git_env(), check=True, capture_output=True, text=True
    ).stdout.strip()


def test_repo_from_git_dir_and_tarball_drops_later_history(tmp_path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    materialize(INTERVALS["repo"], INTERVALS["base_commit"], source)
    (source / "FUTURE.txt").write_text("the fix lives here\n")
    _git(source, "add", "-A")
    _git(source, "commit", "-qm", "later commit")
    tarball = tmp_path / "repo.tar.gz"
    with tarfile.open(tarball, "w:gz") as archive:
        archive.add(source, arcname="intervals")
    for repo in ("src", "repo.tar.gz"):  # relative to the operator's repo root
        dest = tmp_path / f"dest-{Path(repo).name}"
        dest.mkdir()
        materialize(repo, INTERVALS["base_commit"], dest, root=tmp_path)
        assert _git(dest, "rev-parse", "HEAD") == INTERVALS["base_commit"]
        assert not (dest / "FUTURE.txt").exists()
        assert _git(dest, "log", "--all", "--oneline").count("\n") == 0  # one commit only
    (tmp_path / "dest-bad").mkdir()
    with pytest.raises(InvalidRequest, match="base_commit"):
        materialize("src", "0" * 40, tmp_path / "dest-bad", root=tmp_path)
    (source / "escape").symlink_to("/etc")
    for outside in (str(source), "../" + tmp_path.name, "/etc", "escape", "~/x"):
        with pytest.raises(InvalidRequest, match="repo"):
            materialize(outside, INTERVALS["base_commit"], tmp_path / "dest-bad", root=source)


@pytest.mark.parametrize(
    "missing", ["repo", "base_commit", "problem_statement", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS"]
)
def test_validate_instance_names_the_missing_field(missing: str) -> None:
    instance = {k: v for k, v in INTERVALS.items() if k != missing}
    with pytest.raises(InvalidRequest) as info:
        SWEHandler().validate_instance(instance)
    assert info.value.details["field"] == f"instance.{missing}"


def test_instance_data_without_its_id_is_valid() -> None:
    # The gateway validates `data`; the id travels beside it (ctx.instance_id).
    data = {k: v for k, v in INTERVALS.items() if k != "instance_id"}
    assert "instance_id" in INTERVALS and SWEHandler().validate_instance(data) is None
    with pytest.raises(InvalidRequest) as info:  # while a field it does need is checked
        SWEHandler().validate_instance({k: v for k, v in data.items() if k != "repo"})
    assert info.value.details["field"] == "instance.repo"


def test_swe_bench_json_string_test_lists_are_accepted() -> None:
    instance = {**INTERVALS, "FAIL_TO_PASS": json.dumps(INTERVALS["FAIL_TO_PASS"]), "PASS_TO_PASS": "[]"}
    SWEHandler().validate_instance(instance)
    with pytest.raises(InvalidRequest):
        SWEHandler().validate_instance({**INTERVALS, "FAIL_TO_PASS": "not json"})


def test_config_is_strict() -> None:
    with pytest.raises(ValueError, match="tools"):
        SWEHandler.Config.model_validate({"tools": ["browser"]})
    with pytest.raises(ValueError, match="extra"):
        SWEHandler.Config.model_validate({"max_turn": 3})
    assert SWEHandler.Config.model_validate({}).tools == ["bash", "str_replace_editor"]
