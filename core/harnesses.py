"""Operator-registered agent harnesses: what the `harness` agent may start in a sandbox.

A harness is an unmodified agent program (mini-swe-agent, an openai-SDK script, ...) that the
operator installs into a named sandbox environment (`raas env build NAME --package ...`) and
registers here, in the policy (trusted). A job only names a registration
(`agent: harness`, `agent_config: {harness: NAME, task: swe|math|code}`); it never gives a
command line, an environment or a variable of its own. The registration says:

- `command`: the argv started in the sandbox (no shell), with placeholders from
  `COMMAND_FIELDS` (`{task_file}`, `{task}`, `{workspace}`, `{model}`, `{answer_file}`);
- `python_env`: the named environment holding the harness (bound read-only, first on PATH):
  a venv with the pip `packages`, plus `npm_packages` installed beside it whose
  `node_modules/.bin` comes first (harnesses shipped on npm, `sandbox.environments`);
- `python`: the Python version its environment is built from ("3.12"; null: the system
  python), for harnesses that need a newer one than the node's; the interpreter is the
  operator's (`HarnessPolicy.pythons`, else found on the node: `sandbox.pythons`), and a
  version the node lacks fails at submission and at `raas env build`, naming it;
- `files`: config files written for each rollout (`~/...` in the rollout's writable HOME,
  `HOME_DIR`, or `/tmp/...`), templated with the `endpoint_env` placeholders; HOME is that
  folder, outside the workspace, so nothing there is ever part of a diff;
- `env`: extra variables (operator's), and `endpoint_env`: which variables point the harness at
  its per-rollout model endpoint (`{base_url}` = `http://127.0.0.1:PORT/v1`, `{root_url}` =
  `http://127.0.0.1:PORT`, `{token}` = the attempt's capability token, `{model}`);
- `task_field`/`task_file`: the task text (the task kind's own user prompt, e.g. swe's
  problem statement and workspace, or one instance field as it is) and the file it is
  written to inside the sandbox (outside the workspace, so it is never part of a diff);
- `timeout`: the harness's own deadline (RUN also ends at the stage's deadline);
- `tasks`: the task kinds it is fit for; the artifact graded follows the task (swe: the
  workspace diff, code: the solution file, math: `answer_file` in the workspace);
- `tenants`: whether tenants (not only admins) may choose it.
"""

from __future__ import annotations

import re
import string
from importlib.resources import files
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

TaskKind = Literal["swe", "math", "code"]
# Placeholders a registration's `command` and `env` values may use.
COMMAND_FIELDS = frozenset({"task_file", "task", "workspace", "model", "answer_file"})
# ... and its `endpoint_env` values, besides those.
ENDPOINT_FIELDS = frozenset({"base_url", "root_url", "token", "port"})
# A registered name (as `core.policy.NAME_RE`, which imports this module): never a path.
PLAIN_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Variables a registration never sets: they change the loader or the interpreter of every
# process in the sandbox (the same families `core.policy` refuses for jobs).
_FORBIDDEN_VARS = re.compile(r"^(LD_|PYTHON|BASH_FUNC_)|^(ENV|BASH_ENV|PROMPT_COMMAND|IFS|HOME)$")
# The rollout's writable HOME inside the sandbox (on the sandbox's own /tmp: per rollout).
HOME_DIR = "/tmp/raas-home"
# A placeholder in a `files` template: only `{name}` with a known name is filled; other braces
# (JSON, TOML) are the file's own.
_FILE_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")

# The launchers' pip projects, shipped as package data (core/harness_launchers/, which the
# checkout's examples/harness* link to); pip installs each folder into its harness's environment.
_LAUNCHERS = files("core") / "harness_launchers"
# The example agent (a plain bash-tool agent on the openai and anthropic SDKs).
EXAMPLE_AGENT = str(_LAUNCHERS / "harness")
# Console scripts that run smolagents / the OpenAI Agents SDK with their defaults.
SMOLAGENTS_LAUNCHER = str(_LAUNCHERS / "harness_smolagents")
OPENAI_AGENTS_LAUNCHER = str(_LAUNCHERS / "harness_openai_agents")
DEFAULT_ENDPOINT_ENV = {
    "OPENAI_BASE_URL": "{base_url}",
    "OPENAI_API_KEY": "{token}",
    "ANTHROPIC_BASE_URL": "{root_url}",
    "ANTHROPIC_API_KEY": "{token}",
}


def placeholders(text: str) -> set[str]:
    """The `{name}` fields of a format string (a bad one raises ValueError)."""
    return {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}


def _check_fields(text: str, allowed: frozenset[str], where: str) -> None:
    try:
        used = placeholders(text)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc} in {text!r}") from None
    unknown = used - allowed
    if unknown:
        raise ValueError(f"{where}: unknown placeholder(s) {sorted(unknown)} in {text!r}; known: {sorted(allowed)}")


def fill_file(template: str, values: dict[str, str]) -> str:
    """A `files` template with its `{name}` placeholders filled (checked at registration)."""
    return _FILE_FIELD.sub(lambda match: values[match[1]], template)


def file_path(path: str) -> str:
    """Where a `files` entry is written inside the sandbox (`~` is `HOME_DIR`)."""
    return HOME_DIR + path[1:] if path.startswith("~/") else path


def _check_file(path: str, template: str) -> None:
    parts = path.split("/")[1:]
    if not (path.startswith("~/") or path.startswith("/tmp/")) or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"files: {path!r} must be a plain path under ~/ (the rollout's HOME) or /tmp/")
    unknown = {m for m in _FILE_FIELD.findall(template)} - (COMMAND_FIELDS | ENDPOINT_FIELDS)
    if unknown:
        raise ValueError(
            f"files[{path!r}]: unknown placeholder(s) {sorted(unknown)}; known: "
            f"{sorted(COMMAND_FIELDS | ENDPOINT_FIELDS)}"
        )


def _check_vars(env: dict[str, str], allowed: frozenset[str], where: str) -> None:
    for name, value in env.items():
        if not _VAR.match(name) or _FORBIDDEN_VARS.search(name):
            raise ValueError(f"{where}: {name!r} is not a variable a harness may be given")
        _check_fields(value, allowed, f"{where}.{name}")


class HarnessRegistration(BaseModel):
    """One registered harness (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = Field("", description="What the harness is, for `GET /v1/policy`")
    command: list[str] = Field(
        min_length=1, description="argv started in the sandbox (no shell); placeholders COMMAND_FIELDS"
    )
    python_env: str | None = Field(
        None, pattern=PLAIN_NAME, description="Named sandbox environment holding the harness; null: the system python"
    )
    packages: list[str] = Field(
        default_factory=list,
        description="What `raas env build <python_env>` installs; a node builds it on first use like a handler's",
    )
    python: str | None = Field(
        None,
        pattern=r"^3\.\d{1,2}$",
        description="Python version the environment is built from (e.g. 3.12); null: the system python",
    )
    npm_packages: list[str] = Field(
        default_factory=list,
        description="npm packages installed into the same environment; their node_modules/.bin comes first on PATH",
    )
    files: dict[str, str] = Field(
        default_factory=dict,
        description="Per-rollout config files: path (~/... in the rollout's HOME, or /tmp/...) -> template "
        "with the endpoint_env placeholders",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra variables")
    endpoint_env: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_ENDPOINT_ENV),
        description="Variables pointing the harness at its endpoint ({base_url}, {root_url}, {token}, {port}, {model})",
    )
    model: str = Field("raas", min_length=1, description="The model name the harness is told")
    task_field: str | None = Field(
        None, description="Instance field whose text is the task as it is; null: the task kind's own prompt"
    )
    task_file: str = Field("/tmp/raas-task.md", description="Where the task text is written inside the sandbox")
    tasks: list[TaskKind] = Field(
        default_factory=lambda: ["swe", "math", "code"], min_length=1, description="Task kinds it may run"
    )
    answer_file: str = Field("answer.txt", description="math: the workspace file holding the final answer")
    timeout: float = Field(
        1800.0, gt=0, description="Harness deadline, seconds (RUN also ends at the stage's own deadline)"
    )
    tenants: bool = Field(True, description="Whether tenants may choose it (admins always)")

    @field_validator("command")
    @classmethod
    def _command_fields(cls, value: list[str]) -> list[str]:
        for i, arg in enumerate(value):
            _check_fields(arg, COMMAND_FIELDS, f"command[{i}]")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        _check_vars(value, COMMAND_FIELDS, "env")
        return value

    @field_validator("endpoint_env")
    @classmethod
    def _endpoint_env(cls, value: dict[str, str]) -> dict[str, str]:
        _check_vars(value, COMMAND_FIELDS | ENDPOINT_FIELDS, "endpoint_env")
        if not any("{base_url}" in v or "{root_url}" in v for v in value.values()):
            raise ValueError("endpoint_env: no variable gives the harness its endpoint ({base_url} or {root_url})")
        return value

    @field_validator("files")
    @classmethod
    def _files(cls, value: dict[str, str]) -> dict[str, str]:
        for path, template in value.items():
            _check_file(path, template)
        return value

    @field_validator("task_file")
    @classmethod
    def _task_file(cls, value: str) -> str:
        if not value.startswith("/tmp/") or ".." in value.split("/"):
            raise ValueError(
                f"task_file {value!r} must be a path under /tmp (outside the "
                "workspace, whose changes are the swe artifact)"
            )
        return value

    @field_validator("answer_file")
    @classmethod
    def _answer_file(cls, value: str) -> str:
        if value.startswith("/") or ".." in value.split("/") or not value:
            raise ValueError(f"answer_file {value!r} must be a path inside the workspace")
        return value


MINI_SWE_AGENT = HarnessRegistration(
    description="mini-swe-agent (PyPI `mini-swe-agent`), unmodified: its `mini` CLI in yolo "
    "mode with the task file, one bash block per step, through LiteLLM",
    command=[
        "mini",
        "--yolo",
        "--exit-immediately",
        "--cost-limit",
        "0",
        "--model",
        "openai/{model}",
        "--task",
        "{task}",
        "--output",
        "/tmp/raas-mini-trajectory.json",
    ],
    python_env="mini-swe-agent",
    packages=["mini-swe-agent", "pytest"],
    env={
        "MSWEA_COST_TRACKING": "ignore_errors",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "MSWEA_CONFIGURED": "true",
        "MSWEA_SILENT_STARTUP": "1",
    },
    tasks=["swe", "code"],
    timeout=1800.0,
)

OPENAI_AGENT = HarnessRegistration(
    description="a plain bash-tool agent on the official `openai` SDK (core/harness_launchers/"
    "harness/raas_openai_agent.py); `--api anthropic` runs the same loop on the `anthropic` SDK",
    command=["raas-openai-agent", "--task-file", "{task_file}", "--model", "{model}"],
    python_env="openai-agent",
    packages=["openai", "anthropic", "pytest", EXAMPLE_AGENT],
    tasks=["swe", "math", "code"],
    timeout=1800.0,
)


ANTHROPIC_AGENT = OPENAI_AGENT.model_copy(
    update={
        "description": "the same example agent on the official `anthropic` SDK (Messages API, tool_use blocks)",
        "command": [*OPENAI_AGENT.command, "--api", "anthropic"],
    }
)


SMOLAGENTS = HarnessRegistration(
    description="smolagents (PyPI `smolagents`), unmodified: `ToolCallingAgent` + `OpenAIServerModel` "
    "with all their defaults (tool_choice required, its stop strings, final_answer) and one bash "
    "tool, started by core/harness_launchers/harness_smolagents",
    command=["raas-smolagents", "--task-file", "{task_file}", "--model", "{model}"],
    python_env="smolagents",
    packages=["smolagents", "openai", "pytest", SMOLAGENTS_LAUNCHER],
    tasks=["swe", "math", "code"],
    timeout=1800.0,
)


OPENAI_AGENTS = HarnessRegistration(
    description="the OpenAI Agents SDK (PyPI `openai-agents`), unmodified: an `Agent` with one bash "
    "function tool on the SDK's default model (the Responses API), started by "
    "core/harness_launchers/harness_openai_agents",
    command=["raas-openai-agents", "--task-file", "{task_file}", "--model", "{model}"],
    python_env="openai-agents",
    packages=["openai-agents", "pytest", OPENAI_AGENTS_LAUNCHER],
    tasks=["swe", "math", "code"],
    timeout=1800.0,
)


def default_harnesses() -> dict[str, HarnessRegistration]:
    """The registrations shipped as examples and presets (an operator's policy replaces them)."""
    from core.harness_presets import PRESETS

    return {
        "mini-swe-agent": MINI_SWE_AGENT,
        "openai-agent": OPENAI_AGENT,
        "anthropic-agent": ANTHROPIC_AGENT,
        "smolagents": SMOLAGENTS,
        "openai-agents": OPENAI_AGENTS,
        **{name: HarnessRegistration(**fields) for name, fields in PRESETS.items()},
    }


def harness_environments(registered: dict[str, HarnessRegistration]) -> dict[str, tuple[list[str], list[str]]]:
    """Environment name -> (pip packages, npm packages) the registrations declare (the first
    registration naming an environment with packages decides)."""
    found: dict[str, tuple[list[str], list[str]]] = {}
    for harness in registered.values():
        if harness.python_env and (harness.packages or harness.npm_packages):
            found.setdefault(harness.python_env, (list(harness.packages), list(harness.npm_packages)))
    return found


def harness_pythons(registered: dict[str, HarnessRegistration]) -> dict[str, str]:
    """Environment name -> the Python version its registration names (as `harness_environments`
    decides which registration speaks for an environment)."""
    found: dict[str, str | None] = {}
    for harness in registered.values():
        if harness.python_env and (harness.packages or harness.npm_packages):
            found.setdefault(harness.python_env, harness.python)
    return {name: version for name, version in found.items() if version}


class HarnessPolicy(BaseModel):
    """The harnesses of this deployment: registrations by name (`policy.harnesses`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    registered: dict[str, HarnessRegistration] = Field(
        default_factory=default_harnesses, description="Harnesses by name"
    )
    pythons: dict[str, str] = Field(
        default_factory=dict,
        description='Python version -> interpreter path on the nodes (e.g. {"3.12": '
        '"/opt/python3.12/bin/python3.12"}), for registrations naming a `python`; a version not '
        "here is looked for as python3.X on PATH, then in pyenv's versions",
    )

    @field_validator("pythons")
    @classmethod
    def _pythons(cls, value: dict[str, str]) -> dict[str, str]:
        for version, path in value.items():
            if not re.match(r"^3\.\d{1,2}$", version) or not path.startswith("/"):
                raise ValueError(f"pythons: {version!r} -> {path!r} must map a version like 3.12 to an absolute path")
        return value
