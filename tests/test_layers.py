"""The import-direction rule, read from the source with `ast` (no module is imported).

    app (gateway) -> tasks -> agents -> sandbox;  every layer -> core;  nothing the other way.

`sandbox/` imports only itself (it could be a library of its own), `raas_client` (`sdk/`, its
own distribution) only itself (it is what trainers install; the LLM layer, the stages and the
gateway use its rollout record, `Trajectory`, as their own), `migrations/` only core, the fake
inference server `fakellm/` only core (nothing in the product imports it); the gateway's CLI
may run all three. Function-level imports count: a lazy import is still a dependency.
Inside the gateway the service modules never import the HTTP layer (`app/api/`), and one
blueprint never imports another. Over the whole tree there is no import circle between modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "tasks", "agents", "sandbox", "core", "raas_client", "migrations", "fakellm")
# Where a package lives when not at the top of the repository.
FOLDERS = {"raas_client": ROOT / "sdk" / "raas_client"}
# What each top-level package may import besides itself.
ALLOWED = {
    "core": set(),
    "sandbox": set(),
    "raas_client": set(),
    "agents": {"core", "sandbox", "raas_client"},  # the rollout record is the wire's type
    "tasks": {"core", "agents", "sandbox", "raas_client"},
    "app": {
        "core",
        "tasks",
        "agents",
        "sandbox",
        "migrations",
        "raas_client",
        "fakellm",
    },  # the CLI runs them (`raas llm-sim` starts the fake server)
    "migrations": {"core"},
    # The fake inference server: a process of its own, reached over HTTP; only the CLI starts it.
    "fakellm": {"core"},
}
# Inside `tasks/`: the wings, lowest first. A wing imports only itself and wings before it;
# no wing imports the root (the Celery app, the worker, the stages and their helpers compose
# the wings). `recovery` may import the stage helpers' lower wings but never the stages.
TASK_WINGS = ("process", "broker", "writes", "llm", "sandboxing", "watch", "recovery")
# Inside `app/`: the operator's commands (`app.ops`) may use the gateway; the gateway never
# imports them (`app/` is the gateway it says it is).
OPS_PACKAGE = "app.ops"
# Gateway modules that compose the HTTP layer (blueprints) and so may import it.
HTTP_COMPOSERS = {"app.factory", "app.openapi"}
HTTP_PACKAGES = ("app.api", "app.ui")


def module_name(path: Path, package: str) -> str:
    base = FOLDERS.get(package, ROOT / package).parent
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def our_modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted(FOLDERS.get(package, ROOT / package).rglob("*.py")):
            found[module_name(path, package)] = path
    return found


MODULES = our_modules()


def resolve(name: str) -> str | None:
    """The longest prefix of a dotted name that is one of our modules."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def imports_of(module: str, path: Path) -> set[str]:
    """Our modules that `module` imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names] or [base]
        else:
            continue
        for name in names:
            target = resolve(name)
            if target is not None and target != module:
                found.add(target)
    return found


GRAPH = {module: imports_of(module, path) for module, path in MODULES.items()}


def top(module: str) -> str:
    return module.split(".")[0]


def upward_imports() -> list[str]:
    bad = []
    for module, targets in sorted(GRAPH.items()):
        for target in sorted(targets):
            if top(target) != top(module) and top(target) not in ALLOWED[top(module)]:
                bad.append(f"{module} -> {target}")
    return bad


def is_blueprint(module: str) -> bool:
    """A module that makes a Flask Blueprint (a group of routes)."""
    return "Blueprint(" in MODULES[module].read_text()


def package_of(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def gateway_violations() -> list[str]:
    """Service modules never import the HTTP layer; a blueprint is imported only by the
    composers and by the non-blueprint modules of its own package (its pages, its helpers)."""
    bad = []
    for module, targets in sorted(GRAPH.items()):
        if top(module) != "app" or module in HTTP_COMPOSERS:
            continue
        in_http = module.startswith(HTTP_PACKAGES)
        for target in sorted(targets):
            if not target.startswith(HTTP_PACKAGES):
                continue
            if not in_http:
                bad.append(f"service {module} -> HTTP layer {target}")
            elif is_blueprint(target) and (is_blueprint(module) or package_of(target) != package_of(module)):
                bad.append(f"{module} -> blueprint {target}")
    return bad


def wing_of(module: str) -> str | None:
    """`tasks.<wing>` for a module in one of tasks/ wings, None for tasks/ root modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in TASK_WINGS else None


def wing_violations() -> list[str]:
    """Imports in `tasks/` against the wing order, and gateway modules importing `app.ops`."""
    bad = []
    for module, targets in sorted(GRAPH.items()):
        for target in sorted(targets):
            if top(module) == top(target) == "tasks" and wing_of(module) and wing_of(target) != wing_of(module):
                rank = TASK_WINGS.index(wing_of(module))
                if wing_of(target) is None or TASK_WINGS.index(wing_of(target)) > rank:
                    bad.append(f"{module} -> {target}")
            if top(module) == "app" and not module.startswith(OPS_PACKAGE) and target.startswith(OPS_PACKAGE):
                bad.append(f"gateway {module} -> {target}")
    return bad


def circles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in GRAPH[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    return found


def test_the_scan_sees_the_tree():
    assert {
        "core.errors",
        "app.factory",
        "tasks.stages",
        "agents.loop",
        "sandbox.client",
        "raas_client.sdk",
        "migrations.env",
    } <= set(MODULES)
    assert "core.db" in GRAPH["tasks.writes.lifecycle"]  # a known edge is found


def test_no_import_runs_up_the_layers():
    assert upward_imports() == []


def test_services_do_not_import_http_and_blueprints_not_each_other():
    assert gateway_violations() == []


def test_tasks_wings_point_one_way_and_the_gateway_never_imports_ops():
    assert wing_violations() == []


def test_the_wing_rule_catches_a_wing_importing_the_stages():
    GRAPH["tasks.writes.fake"] = {"tasks.stages", "tasks.recovery.reaper", "tasks.broker.config"}
    GRAPH["app.fake"] = {"app.ops.node"}
    try:
        assert wing_violations() == [
            "gateway app.fake -> app.ops.node",
            "tasks.writes.fake -> tasks.recovery.reaper",
            "tasks.writes.fake -> tasks.stages",
        ]
    finally:
        del GRAPH["tasks.writes.fake"], GRAPH["app.fake"]


def test_agents_never_touch_the_database():
    """The agent loop, handlers and LLM layer see the pool interface, never a session."""
    assert [
        f"{m} -> core.db" for m, targets in sorted(GRAPH.items()) if top(m) == "agents" and "core.db" in targets
    ] == []


def test_no_import_circle():
    assert circles() == []


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import tasks.stages\n", ["sandbox.fake -> tasks.stages"]),
        ("def f():\n    from app.jobs import create_job\n", ["sandbox.fake -> app.jobs"]),
        ("from core import errors\n", ["sandbox.fake -> core.errors"]),
        ("from sandbox import client\n", []),
    ],
)
def test_the_rule_catches_an_upward_import(tmp_path, source, expected):
    path = tmp_path / "fake.py"
    path.write_text(source)
    GRAPH["sandbox.fake"] = imports_of("sandbox.fake", path)
    try:
        assert upward_imports() == expected
    finally:
        del GRAPH["sandbox.fake"]


def test_a_circle_is_caught():
    GRAPH["agents.fake_a"], GRAPH["agents.fake_b"] = {"agents.fake_b"}, {"agents.fake_a"}
    try:
        assert ["agents.fake_a", "agents.fake_b"] in circles()
    finally:
        del GRAPH["agents.fake_a"], GRAPH["agents.fake_b"]


def test_only_the_cli_starts_the_fake_llm():
    """The fake inference server is a process of its own: the product reaches it over HTTP."""
    assert sorted(
        m for m, targets in GRAPH.items() if top(m) != "fakellm" and any(top(t) == "fakellm" for t in targets)
    ) == ["app.ops.cli"]
