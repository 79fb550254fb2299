"""Tools an agent calls: a name, a JSON-schema signature, and an `execute` against the sandbox.

Every handler builds its tool list from these (`builtin_tools(["bash", ...])` plus a
`finish_tool(...)`) and hands it to `agents.loop.run_agent_loop`. A tool's `schema()` is the
OpenAI/Qwen function schema given to the chat template. Misuse by the model (unknown tool, bad
arguments, a failed `str_replace`) never raises: `call_tool` turns it into an observation with
`error=True`, because a policy under RL must see and learn from its mistakes. Infrastructure
failures (`sandbox.SandboxError`, cancel, deadline) do raise, so they are never mistaken for
agent behaviour.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agents.contexts import RunContext
from core.errors import InvalidRequest

MIN_TOOL_TIMEOUT = 0.5  # a call squeezed by the deadline still gets a usable slice
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


@dataclass
class ToolOutput:
    """What a tool call produced: observation text, and whether it ends the episode."""

    text: str
    finish: bool = False
    answer: Any = None
    error: bool = False  # the call was invalid (counted in the rollout's metrics)


@dataclass
class Tool:
    """A callable tool: `run(ctx, arguments)` does the work once arguments are validated."""

    name: str
    description: str
    parameters: dict[str, Any]
    run: Callable[[RunContext, dict[str, Any]], ToolOutput | str]
    metadata: dict[str, Any] = field(default_factory=dict)

    def schema(self) -> dict[str, Any]:
        """The OpenAI/Qwen function schema passed to the chat template."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def execute(self, ctx: RunContext, arguments: dict[str, Any]) -> ToolOutput:
        """Validate `arguments` against the schema, then run; bad arguments are an observation."""
        problem = check_arguments(self.parameters, arguments)
        if problem:
            return ToolOutput(f"Error: invalid arguments for {self.name}: {problem}", error=True)
        result = self.run(ctx, arguments)
        return result if isinstance(result, ToolOutput) else ToolOutput(str(result))


def check_arguments(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """The first way `arguments` break the (flat) JSON schema, or None if they fit it."""
    properties = schema.get("properties", {})
    missing = [name for name in schema.get("required", []) if name not in arguments]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}"
    if schema.get("additionalProperties") is False:
        unknown = sorted(set(arguments) - set(properties))
        if unknown:
            return f"unknown argument(s): {', '.join(unknown)}; expected: {', '.join(properties)}"
    for name, value in arguments.items():
        spec = properties.get(name, {})
        expected = spec.get("type")
        types = [expected] if isinstance(expected, str) else list(expected or [])
        if types and not any(_is_type(value, t) for t in types):
            return f"{name!r} must be of type {' or '.join(types)}"
        if "enum" in spec and value not in spec["enum"]:
            return f"{name!r} must be one of {spec['enum']}, not {value!r}"
    return None


def _is_type(value: Any, json_type: str) -> bool:
    if isinstance(value, bool) and json_type in ("integer", "number"):
        return False
    return isinstance(value, _JSON_TYPES.get(json_type, (object,)))


def call_timeout(ctx: RunContext) -> float:
    """Seconds a tool call may take: the job's tool_timeout, cut to what the stage has left."""
    limit = ctx.limits.tool_timeout
    return max(MIN_TOOL_TIMEOUT, min(limit, ctx.remaining()))


def _sandbox(ctx: RunContext) -> Any:
    if ctx.sandbox is None:
        raise InvalidRequest("this tool needs a sandbox but the job's runtime is 'none'", field="sandbox.runtime")
    return ctx.sandbox


def _run_bash(ctx: RunContext, arguments: dict[str, Any]) -> ToolOutput:
    timeout = call_timeout(ctx)
    result = _sandbox(ctx).bash(arguments["command"], timeout=timeout)
    text = result.output.rstrip("\n")
    if result.timed_out:
        text += f"\n[command timed out after {timeout:.0f}s and was interrupted]"
    elif result.exit_code not in (0, None):
        text += f"\n[exit code: {result.exit_code}]"
    return ToolOutput(text or "[no output]")


def _run_python(ctx: RunContext, arguments: dict[str, Any]) -> ToolOutput:
    timeout = call_timeout(ctx)
    result = _sandbox(ctx).python(arguments["code"], timeout=timeout)
    parts = [p.rstrip("\n") for p in (result.output, result.error) if p]
    if result.timed_out:
        parts.append(f"[execution timed out after {timeout:.0f}s and was interrupted]")
    return ToolOutput("\n".join(parts) or "[no output]")


def _run_editor(ctx: RunContext, arguments: dict[str, Any]) -> ToolOutput:
    from sandbox import ToolUsageError  # the sandbox package is only needed by sandbox tools

    try:
        result = _sandbox(ctx).edit(**arguments)
    except ToolUsageError as exc:
        return ToolOutput(f"Error: {exc}", error=True)
    return ToolOutput(str(getattr(result, "output", result)))


def bash_tool() -> Tool:
    """A persistent bash shell in the sandbox (state such as cwd and env carries over)."""
    return Tool(
        name="bash",
        description=(
            "Run a command in a persistent bash shell in your sandbox and return its "
            "output. The working directory and environment persist between calls. "
            "Long-running commands are interrupted at the time limit."
        ),
        parameters={
            "type": "object",
            "additionalProperties": False,
            "required": ["command"],
            "properties": {"command": {"type": "string", "description": "The bash command to run"}},
        },
        run=_run_bash,
    )


def python_tool() -> Tool:
    """A persistent Python session in the sandbox (variables survive between calls)."""
    return Tool(
        name="python",
        description=(
            "Execute Python code in a persistent interpreter session and return "
            "stdout/stderr and the value of the last expression. Variables and "
            "imports persist between calls."
        ),
        parameters={
            "type": "object",
            "additionalProperties": False,
            "required": ["code"],
            "properties": {"code": {"type": "string", "description": "Python source to execute"}},
        },
        run=_run_python,
    )


def editor_tool() -> Tool:
    """The str_replace_editor file tool (view / create / str_replace / insert / undo_edit)."""
    return Tool(
        name="str_replace_editor",
        description=(
            "View, create and edit files. `view` shows a file with line numbers (or lists a "
            "directory); `create` writes `file_text` to a new file; `str_replace` replaces "
            "`old_str`, which must occur exactly once, by `new_str`; `insert` adds `new_str` "
            "after line `insert_line`; `undo_edit` reverts the last edit of `path`."
        ),
        parameters={
            "type": "object",
            "additionalProperties": False,
            "required": ["command", "path"],
            "properties": {
                "command": {
                    "type": "string",
                    "enum": ["view", "create", "str_replace", "insert", "undo_edit"],
                    "description": "The edit operation",
                },
                "path": {"type": "string", "description": "File or directory path"},
                "file_text": {"type": "string", "description": "Content for `create`"},
                "old_str": {"type": "string", "description": "Exact text to replace"},
                "new_str": {"type": "string", "description": "Replacement / inserted text"},
                "insert_line": {"type": "integer", "description": "Insert after this line"},
                "view_range": {
                    "type": "array",
                    "items": {"type": "integer"},
                    "description": "[start, end] lines for `view` (end -1 = EOF)",
                },
            },
        },
        run=_run_editor,
    )


def finish_tool(
    name: str = "finish",
    description: str | None = None,
    answer_param: str | None = "answer",
    answer_description: str = "Your final answer",
) -> Tool:
    """A tool that ends the episode; its `answer_param` argument (if any) is the answer."""
    properties: dict[str, Any] = {}
    if answer_param:
        properties[answer_param] = {"type": "string", "description": answer_description}

    def run(ctx: RunContext, arguments: dict[str, Any]) -> ToolOutput:
        answer = arguments.get(answer_param) if answer_param else None
        return ToolOutput("Submitted.", finish=True, answer=answer)

    return Tool(
        name=name,
        description=description or "Call this when you are done to end the task.",
        parameters={
            "type": "object",
            "additionalProperties": False,
            "properties": properties,
            "required": [answer_param] if answer_param else [],
        },
        run=run,
    )


BUILTIN_TOOLS: dict[str, Callable[[], Tool]] = {
    "bash": bash_tool,
    "python": python_tool,
    "str_replace_editor": editor_tool,
}


def builtin_tools(names: list[str]) -> list[Tool]:
    """Fresh instances of the named built-in tools; an unknown name lists the valid ones."""
    unknown = [n for n in names if n not in BUILTIN_TOOLS]
    if unknown:
        raise InvalidRequest(f"unknown tool(s) {unknown}; valid: {sorted(BUILTIN_TOOLS)}", field="tools")
    return [BUILTIN_TOOLS[n]() for n in names]


def call_tool(ctx: RunContext, tools: dict[str, Tool], name: str, arguments: dict[str, Any]) -> ToolOutput:
    """Run one parsed call; an unknown tool is an error observation, not an exception."""
    tool = tools.get(name)
    if tool is None:
        return ToolOutput(f"Error: unknown tool {name!r}; available tools: {', '.join(tools)}", error=True)
    return tool.execute(ctx, arguments)


def describe_tools(tools: list[Tool]) -> str:
    """A Hermes-style tool block for chat templates that cannot render tool schemas."""
    schemas = "\n".join(json.dumps(t.schema()) for t in tools)
    return (
        "You have access to the following tools:\n<tools>\n" + schemas + "\n</tools>\n"
        "To call a tool, write one or more blocks like:\n<tool_call>\n"
        '{"name": "<tool name>", "arguments": {<JSON arguments>}}\n</tool_call>'
    )
