"""What the product once wrote in several places is written in one (issue 39, "one of each").

Read from the source with `ast`, like `tests/test_layers.py`: the tool server's flags only in
`sandbox/inside.py`, the gateway's settings and poll interval only in `app/context.py`, and a
rollout count's old second names only where old rows are read (`agents/counters.py`).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def string_constants(path: Path) -> set[str]:
    """Every string literal of a module (docstrings included)."""
    tree = ast.parse(path.read_text(), str(path))
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def modules(*folders: str) -> list[Path]:
    return [p for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))]


def test_only_one_module_writes_the_tool_servers_command_line() -> None:
    flags = {"--workspace", "--workdir", "--ready-fd", "--listen-fd", "--signal-fd"}
    writers = [p.relative_to(ROOT).as_posix() for p in modules("sandbox") if flags & string_constants(p)]
    # the server's own parser reads them; the runtimes call `server_argv`
    assert writers == ["sandbox/inside.py", "sandbox/toolserver/server.py"]


def test_the_gateway_reads_its_settings_and_poll_interval_in_one_place() -> None:
    found = []
    for path in modules("app"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "_settings":
                found.append(f"{path.relative_to(ROOT)}: def _settings")
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "POLL_SECONDS" for t in node.targets
            ):
                found.append(f"{path.relative_to(ROOT)}: POLL_SECONDS =")
            elif (
                isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "RAAS"
            ):
                found.append(f"{path.relative_to(ROOT)}: config['RAAS']")
    assert found == ["app/context.py: POLL_SECONDS ="]


def test_a_count_has_one_metric_name() -> None:
    old = {"tool_calls_parsed", "tool_calls_failed", "parse_errors"}
    writers = [p.relative_to(ROOT).as_posix() for p in modules("agents", "tasks", "app") if old & string_constants(p)]
    # counters.py and loop.py read the old names of stored rows; parse_errors is also a turn's
    # `extra` key (the errors themselves, not a count) in the loop and the harness
    assert writers == ["agents/counters.py", "agents/harness/calls.py", "agents/loop.py"]
