"""A registration's per-rollout config files and writable HOME (issue 36), and the npm presets.

`files` are templated with the endpoint's placeholders only (other braces are the file's own:
JSON, TOML), written into the rollout's HOME on the sandbox's own /tmp (never the workspace,
so never in a swe diff), and checked at registration like every other field.
"""

from __future__ import annotations

import json
import tomllib

import pytest
from pydantic import ValidationError

from agents.handlers.harness import launch
from core.harness_presets import PRESETS
from core.harnesses import HOME_DIR, HarnessRegistration, file_path, fill_file

VALUES = {
    "base_url": "http://127.0.0.1:4242/v1",
    "root_url": "http://127.0.0.1:4242",
    "token": "tok-abc",
    "port": "4242",
    "model": "policy-7b",
    "task_file": "/tmp/raas-task.md",
    "task": "fix it",
    "workspace": "/ws",
    "answer_file": "answer.txt",
}


def reg(**fields) -> HarnessRegistration:
    return HarnessRegistration(**{"command": ["agent", "{task_file}"], **fields})


@pytest.mark.parametrize(
    "files, message",
    [
        ({"/etc/agent.json": "x"}, "under ~/"),
        ({"~/../etc/x": "x"}, "under ~/"),
        ({"~/a/./b": "x"}, "under ~/"),
        ({"/tmp/a//b": "x"}, "under ~/"),
        ({"~": "x"}, "under ~/"),
        ({"relative/x": "x"}, "under ~/"),
        ({"~/.cfg": 'key = "{secret}"'}, "unknown placeholder"),
        ({"~/.cfg": "home = {HOME}"}, "unknown placeholder"),
    ],
)
def test_a_bad_file_fails_at_registration_naming_it(files, message) -> None:
    with pytest.raises(ValidationError, match=message):
        reg(files=files)


@pytest.mark.parametrize("where", ["env", "endpoint_env"])
def test_home_is_the_rollouts_own(where) -> None:
    with pytest.raises(ValidationError, match="HOME"):
        reg(**{where: {"HOME": "/root", "OPENAI_BASE_URL": "{base_url}"}})


def test_the_policy_shows_file_paths_never_their_text() -> None:
    from core.policy import Policy

    harness = reg(files={"~/.cfg": "other_service_key = s3cr3t\nurl = {base_url}"})
    public = Policy(harnesses={"registered": {"x": harness}}).public()
    assert public["harnesses"]["registered"]["x"]["files"] == ["~/.cfg"]
    assert "s3cr3t" not in str(public)


def test_only_known_placeholders_are_filled_and_other_braces_stay() -> None:
    template = '{"provider": {"url": "{base_url}", "key": "{token}"}, "m": {"{model}": {}}}\nx = { a = 1 }'
    text = fill_file(template, VALUES)
    assert text == (
        '{"provider": {"url": "http://127.0.0.1:4242/v1", "key": "tok-abc"}, "m": {"policy-7b": {}}}\nx = { a = 1 }'
    )
    assert file_path("~/.codex/config.toml") == f"{HOME_DIR}/.codex/config.toml"
    assert file_path("/tmp/agent.json") == "/tmp/agent.json"


def test_the_files_are_written_into_a_private_home_outside_the_workspace(make_sandbox, tmp_path) -> None:
    """A real bwrap sandbox: the files land with their text, HOME is 0700, the workspace has
    nothing new (the swe diff cannot see them)."""
    harness = reg(
        files={"~/.config/agent/config.json": '{"url": "{base_url}", "key": "{token}"}', "/tmp/extra.txt": "{model}"}
    )
    workspace = tmp_path / "ws"
    workspace.mkdir()
    sb = make_sandbox(str(workspace))
    launch.write_home(sb, harness, VALUES)
    result = sb.bash(f"cat {HOME_DIR}/.config/agent/config.json; echo; cat /tmp/extra.txt; echo; stat -c %a {HOME_DIR}")
    assert result.output.splitlines() == [
        '{"url": "http://127.0.0.1:4242/v1", "key": "tok-abc"}',
        "policy-7b",
        "700",
    ]
    assert list(workspace.iterdir()) == []
    # a value with quotes, dollars and newlines is written as it is, never run by the shell
    launch.write_home(sb, reg(files={"~/x": "$(touch /tmp/pwned) '\"\n{task}"}), {**VALUES, "task": "a'b\"$c"})
    assert sb.bash(f"cat {HOME_DIR}/x; ls /tmp/pwned").output.startswith("$(touch /tmp/pwned) '\"\na'b\"$c")
    assert sb.bash("test -e /tmp/pwned").exit_code != 0


def test_the_presets_are_registered_with_their_environments_and_render_fully() -> None:
    from core.harnesses import default_harnesses

    shipped = default_harnesses()
    presets = {name: shipped[name] for name in PRESETS}
    assert set(presets) == {"claude-code", "qwen-code", "opencode", "gemini-cli", "codex", "aider", "openhands"}
    # only OpenHands needs a newer Python than the system's (its SDK: >= 3.12)
    assert {name: h.python for name, h in presets.items() if h.python} == {"openhands": "3.12"}
    for name, harness in presets.items():
        # each pins its package: on npm, or on PyPI (aider, OpenHands)
        pinned = harness.npm_packages or [p for p in harness.packages if "==" in p]
        assert harness.python_env == name and pinned and "pytest" in harness.packages
        for path, template in harness.files.items():
            text = fill_file(template, VALUES)
            if path.endswith(".json"):
                json.loads(text)
            if path.endswith(".toml"):
                tomllib.loads(text)
    codex = tomllib.loads(fill_file(presets["codex"].files["~/.codex/config.toml"], VALUES))
    assert codex["model_providers"]["raas"] == {
        "name": "raas",
        "base_url": "http://127.0.0.1:4242/v1",
        "env_key": "RAAS_API_KEY",
        "wire_api": "responses",
        "request_max_retries": 0,
        "stream_max_retries": 0,
    }
    opencode = json.loads(fill_file(presets["opencode"].files["~/.config/opencode/opencode.json"], VALUES))
    assert opencode["provider"]["raas"]["options"] == {"baseURL": "http://127.0.0.1:4242/v1", "apiKey": "tok-abc"}
    assert opencode["model"] == "raas/policy-7b"
    # aider finds the model in its metadata file (or it would fetch LiteLLM's price list)
    aider = json.loads(fill_file(presets["aider"].files["~/.aider.model.metadata.json"], VALUES))
    assert aider["openai/policy-7b"]["litellm_provider"] == "openai"
    histories = [arg for arg in presets["aider"].command if arg.endswith((".history", ".history.md"))]
    assert len(histories) == 2 and all(arg.startswith(HOME_DIR + "/") for arg in histories)
