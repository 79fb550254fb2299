"""Presets: popular coding harnesses shipped on npm and PyPI, registered as they are (issue 36).

Each runs unmodified in its own environment (`raas env build <name>`: a venv with pytest for
the swe tests, and the npm package beside it or the pip package in it), gets the task from its
own command line in its headless mode, and reaches only its rollout's endpoint: through its own base-url variables or
a config file written into the rollout's HOME (`files`). Telemetry, update checks and other
traffic are switched off where the CLI allows (the sandbox has no network anyway: a CLI that
tried would only wait). Versions are pinned to the ones tested here (an operator's policy can
register newer ones); the dialect each speaks is in docs/harnesses.md.

They are plain registration fields (what an operator would write in the policy), validated
as `HarnessRegistration`s by `core.harnesses.default_harnesses`, which imports this module.
"""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

# The rollout's HOME (`core.harnesses.HOME_DIR`, which imports this module: not imported back).
HOME_DIR = "/tmp/raas-home"

# What every preset's environment has besides its npm package: pytest, for the swe tests.
PIP = ["pytest"]

CLAUDE_CODE: dict[str, Any] = dict(
    description="Claude Code (npm `@anthropic-ai/claude-code`), headless `claude -p` with "
    "permissions bypassed; Anthropic Messages",
    command=[
        "claude",
        "-p",
        "{task}",
        "--model",
        "{model}",
        "--dangerously-skip-permissions",
        "--no-session-persistence",
        "--tools=Bash,Read,Edit,Write",  # one word: the option takes every word after it
    ],
    python_env="claude-code",
    packages=PIP,
    npm_packages=["@anthropic-ai/claude-code@2.1.197"],
    env={
        "IS_SANDBOX": "1",  # lets --dangerously-skip-permissions run as the sandbox's root
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_BUG_COMMAND": "1",
    },
    endpoint_env={
        "ANTHROPIC_BASE_URL": "{root_url}",
        "ANTHROPIC_API_KEY": "{token}",
        "ANTHROPIC_MODEL": "{model}",
        # its background ("haiku") calls go to the same policy
        "ANTHROPIC_SMALL_FAST_MODEL": "{model}",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "{model}",
    },
    files={"~/.claude/settings.json": json.dumps({"permissions": {"defaultMode": "bypassPermissions"}}, indent=1)},
    tasks=["swe", "code", "math"],
)

QWEN_CODE: dict[str, Any] = dict(
    description="Qwen Code (npm `@qwen-code/qwen-code`), headless with a prompt and --yolo; OpenAI Chat",
    command=["qwen", "--yolo", "--auth-type", "openai", "--model", "{model}", "--prompt", "{task}"],
    python_env="qwen-code",
    packages=PIP,
    npm_packages=["@qwen-code/qwen-code@0.15.10"],
    endpoint_env={"OPENAI_BASE_URL": "{base_url}", "OPENAI_API_KEY": "{token}", "OPENAI_MODEL": "{model}"},
    files={
        "~/.qwen/settings.json": json.dumps(
            {
                "security": {"auth": {"selectedType": "openai"}, "folderTrust": {"enabled": False}},
                "privacy": {"usageStatisticsEnabled": False},
                "telemetry": {"enabled": False},
                "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
            },
            indent=1,
        )
    },
    tasks=["swe", "code", "math"],
)

OPENCODE: dict[str, Any] = dict(
    description="OpenCode (npm `opencode-ai`, a binary), `opencode run` with a custom "
    "OpenAI-compatible provider in its config; OpenAI Chat",
    # --title: no separate title-generation call to the policy
    command=["opencode", "run", "--title", "raas", "--model", "raas/{model}", "{task}"],
    python_env="opencode",
    packages=PIP,
    npm_packages=["opencode-ai@1.18.33"],
    env={
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_SHARE": "1",
    },
    endpoint_env={"OPENAI_BASE_URL": "{base_url}", "OPENAI_API_KEY": "{token}"},
    files={
        "~/.config/opencode/opencode.json": json.dumps(
            {
                "$schema": "https://opencode.ai/config.json",
                "provider": {
                    "raas": {
                        "npm": "@ai-sdk/openai-compatible",  # bundled in the binary: nothing fetched
                        "name": "raas",
                        "options": {"baseURL": "{base_url}", "apiKey": "{token}"},
                        "models": {"{model}": {"name": "{model}", "tool_call": True}},
                    }
                },
                "model": "raas/{model}",
                "small_model": "raas/{model}",
                "autoupdate": False,
                "share": "disabled",
                "permission": "allow",
            },
            indent=1,
        )
    },
    tasks=["swe", "code", "math"],
)

GEMINI_CLI: dict[str, Any] = dict(
    description="Gemini CLI (npm `@google/gemini-cli`), headless --prompt with --yolo; Google "
    "generateContent (streamGenerateContent?alt=sse)",
    command=["gemini", "--yolo", "--model", "{model}", "--prompt", "{task}"],
    python_env="gemini-cli",
    packages=PIP,
    npm_packages=["@google/gemini-cli@0.61.0"],
    env={"GEMINI_CLI_NO_RELAUNCH": "true"},  # no second node process for a bigger heap
    endpoint_env={"GOOGLE_GEMINI_BASE_URL": "{root_url}", "GEMINI_API_KEY": "{token}"},
    files={
        "~/.gemini/settings.json": json.dumps(
            {
                # an API key, and no trust prompt (it would turn --yolo back into "default")
                "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
                "privacy": {"usageStatisticsEnabled": False},
                "telemetry": {"enabled": False},
                "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
            },
            indent=1,
        )
    },
    tasks=["swe", "code", "math"],
)

CODEX_CONFIG = """\
model = "{model}"
model_provider = "raas"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.raas]
name = "raas"
base_url = "{base_url}"
env_key = "RAAS_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false
"""

CODEX: dict[str, Any] = dict(
    description="Codex CLI (npm `@openai/codex`, a binary), `codex exec` with a model provider "
    "for the endpoint in ~/.codex/config.toml; OpenAI Responses",
    command=[
        "codex",
        "exec",
        "--skip-git-repo-check",
        # the rollout's sandbox is raas's: Codex's own (landlock, seccomp) stays off
        "--dangerously-bypass-approvals-and-sandbox",
        "--model",
        "{model}",
        "{task}",
    ],
    python_env="codex",
    packages=PIP,
    npm_packages=["@openai/codex@0.171.0"],
    endpoint_env={"RAAS_API_KEY": "{token}", "OPENAI_BASE_URL": "{base_url}"},
    files={"~/.codex/config.toml": CODEX_CONFIG},
    tasks=["swe", "code", "math"],
)

# aider asks LiteLLM's price list (fetched from GitHub) for a model it does not know unless a
# metadata file names it: this one does, free, with a context it sizes its repo map from.
AIDER_MODEL_METADATA = json.dumps(
    {
        "openai/{model}": {
            "max_input_tokens": 32768,
            "max_output_tokens": 4096,
            "input_cost_per_token": 0,
            "output_cost_per_token": 0,
            "litellm_provider": "openai",
            "mode": "chat",
        }
    },
    indent=1,
)

AIDER: dict[str, Any] = dict(
    description="aider (PyPI `aider-chat`), one headless message with --yes-always; edits as "
    "SEARCH/REPLACE blocks in its replies (no tool calls), through LiteLLM; OpenAI Chat",
    command=[
        "aider",
        "--message-file",
        "{task_file}",
        "--model",
        "openai/{model}",
        "--edit-format",
        "diff",  # SEARCH/REPLACE blocks (an unknown model would get "whole": every file re-sent)
        "--yes-always",  # adds the files the model names, applies its edits (never runs its shell commands)
        # the workspace is the artifact: no commits, no .gitignore edit, its histories in HOME
        "--no-auto-commits",
        "--no-dirty-commits",
        "--no-gitignore",
        "--input-history-file",
        f"{HOME_DIR}/.aider.input.history",
        "--chat-history-file",
        f"{HOME_DIR}/.aider.chat.history.md",
        "--no-check-update",
        "--no-analytics",
        "--no-show-model-warnings",
        "--no-show-release-notes",
        "--no-detect-urls",
        "--no-pretty",
        "--no-fancy-input",
    ],
    python_env="aider",
    packages=["aider-chat==0.86.2", *PIP],
    env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"},  # LiteLLM's own price list: the bundled copy
    endpoint_env={"OPENAI_API_BASE": "{base_url}", "OPENAI_API_KEY": "{token}"},
    files={"~/.aider.model.metadata.json": AIDER_MODEL_METADATA},
    tasks=["swe", "code", "math"],
)

# The OpenHands SDK needs Python >= 3.12 (PEP 695 generics): its environment names the version,
# which the node finds (`sandbox.pythons`: pyenv's here) and binds into the sandbox.
OPENHANDS_VERSION = "1.58.2"
OPENHANDS_LAUNCHER = str(files("core") / "harness_launchers" / "harness_openhands")

OPENHANDS: dict[str, Any] = dict(
    description="OpenHands (PyPI `openhands-sdk` + `openhands-tools`, Python 3.12), headless: the "
    "SDK's Agent with its terminal and file-editor tools in a local conversation on the "
    "workspace, started by core/harness_launchers/harness_openhands; OpenAI Chat through LiteLLM",
    command=["raas-openhands", "--task-file", "{task_file}", "--model", "{model}"],
    python_env="openhands",
    python="3.12",
    packages=[
        f"openhands-sdk=={OPENHANDS_VERSION}",
        f"openhands-tools=={OPENHANDS_VERSION}",
        *PIP,
        OPENHANDS_LAUNCHER,
    ],
    env={
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # LiteLLM's own price list: the bundled copy
        "OPENHANDS_SUPPRESS_BANNER": "1",
        # its terminal runs in tmux, whose panes start $SHELL, else the user's login shell:
        # the sandbox user's is nologin (every pane would exit at once)
        "SHELL": "/bin/bash",
    },
    endpoint_env={"OPENAI_BASE_URL": "{base_url}", "OPENAI_API_KEY": "{token}"},
    tasks=["swe", "code", "math"],
)

PRESETS: dict[str, dict[str, Any]] = {
    "claude-code": CLAUDE_CODE,
    "qwen-code": QWEN_CODE,
    "opencode": OPENCODE,
    "gemini-cli": GEMINI_CLI,
    "codex": CODEX,
    "aider": AIDER,
    "openhands": OPENHANDS,
}
