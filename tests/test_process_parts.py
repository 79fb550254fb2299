"""One owner for a process's long-lived parts (`tasks.process.parts`): made and started after
what they require, stopped in reverse, each once; and no module of `tasks/` keeps mutable
state of its own (the parts hold it)."""

from __future__ import annotations

import ast
from pathlib import Path


import pytest

from tasks.process.parts import MissingPart, ProcessParts, Step


class _Part:
    def __init__(self, name: str, events: list[str], fail_stop: bool = False) -> None:
        self.name, self.events, self.fail_stop = name, events, fail_stop

    def start(self) -> None:
        self.events.append(f"start {self.name}")

    def stop(self) -> None:
        self.events.append(f"stop {self.name}")
        if self.fail_stop:
            raise RuntimeError("stop failed")


class Beat(_Part): ...


class Log(_Part): ...


class Clearer(_Part): ...


def _steps(events: list[str], fail: type | None = None) -> list[Step]:
    made = lambda kind: lambda parts: kind(kind.__name__, events, fail_stop=kind is fail)  # noqa: E731
    return [
        Step(Clearer, made(Clearer), requires=(Log,)),  # declared first, made last
        Step(Log, made(Log), requires=(Beat,)),
        Step(Beat, made(Beat)),
    ]


def test_parts_start_after_what_they_require_and_stop_in_reverse_once() -> None:
    events: list[str] = []
    parts = ProcessParts(_steps(events))
    assert parts.names() == ["Beat", "Log", "Clearer"] and events == []  # made, not started
    parts.start()
    parts.start()  # once
    assert events == ["start Beat", "start Log", "start Clearer"]
    parts.stop()
    parts.stop()  # once
    assert events[3:] == ["stop Clearer", "stop Log", "stop Beat"]
    assert parts.shutting_down.is_set()


def test_a_failing_stop_does_not_keep_the_others_running() -> None:
    events: list[str] = []
    parts = ProcessParts(_steps(events, fail=Log)).start()
    parts.stop()
    assert events[3:] == ["stop Clearer", "stop Log", "stop Beat"]


def test_a_part_is_found_by_its_type_and_a_missing_one_is_named() -> None:
    parts = ProcessParts(_steps([]))
    assert isinstance(parts.get(Log), Log) and parts.has(Beat)
    with pytest.raises(MissingPart, match="no int .*Beat, Log, Clearer"):
        parts.get(int)


def test_a_step_sees_the_parts_it_requires_when_it_is_made() -> None:
    events: list[str] = []
    steps = [
        Step(Beat, lambda parts: Beat("b", events)),
        Step(Log, lambda parts: Log(f"after {parts.get(Beat).name}", events), requires=(Beat,)),
    ]
    assert ProcessParts(steps).get(Log).name == "after b"


def test_missing_and_circular_requirements_fail_when_the_parts_are_made() -> None:
    with pytest.raises(MissingPart, match="Log requires Beat"):
        ProcessParts([Step(Log, lambda p: Log("l", []), requires=(Beat,))])
    with pytest.raises(ValueError, match="circle"):
        ProcessParts(
            [Step(Log, lambda p: Log("l", []), requires=(Beat,)), Step(Beat, lambda p: Beat("b", []), requires=(Log,))]
        )


def test_a_stage_pool_starts_its_parts_in_the_declared_order() -> None:
    """`tasks.worker`: what the stages use comes first, the consumer row once they can work,
    the drain and INIT's gate last; made without starting a thread."""
    import threading

    from core.settings import Settings
    from tasks.worker import pool_steps, stage_steps

    settings = Settings(node="n1")
    before = threading.active_count()
    parts = ProcessParts([*stage_steps(settings), *pool_steps(settings, object(), "init")])
    assert parts.names() == [
        "Intake",
        "CancelMemory",
        "LiveQueues",
        "PoolMemory",
        "Heartbeater",
        "TurnLog",
        "MarkClearer",
        "ConsumerBeat",
        "Drain",
        "InitGate",
    ]
    assert threading.active_count() == before
    # declared the other way round, every part still comes after the parts it requires
    flipped = ProcessParts([*pool_steps(settings, object(), "init"), *stage_steps(settings)]).steps
    kinds = [step.kind for step in flipped]
    assert all(kinds.index(needed) < kinds.index(step.kind) for step in flipped for needed in step.requires)
    assert "InitGate" not in ProcessParts([*stage_steps(settings), *pool_steps(settings, object(), "run")]).names()


# Module-level state left in `tasks/`, each with why it is not a part of a process's owner.
LEFT = {
    # The retry budget of every `@retrying` write (set once by the worker before its threads
    # start): the writes take a database url, not a handle a budget could travel with.
    "tasks/writes/db_retry.py": {"_budget"},
    # Redis servers this process started as daemons, for the tests' teardown: any process
    # that makes a Celery app may start one, not only a worker.
    "tasks/broker/embedded_redis.py": {"_started_here"},
}
STATEFUL = {"dict", "list", "set", "OrderedDict", "defaultdict", "deque", "Event", "Lock", "RLock", "count"}
MUTATORS = {"add", "append", "clear", "discard", "extend", "insert", "pop", "popitem", "remove", "setdefault"}
MUTATORS |= {"update", "set"}  # a dict's update, an Event's set


def _module_state(path: Path) -> set[str]:
    """Module-level names bound to a mutable or stateful value that the module writes after
    import (or rebinds through `global`)."""
    tree = ast.parse(path.read_text())
    rebound = {n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names}
    written = set(rebound)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            written.add(getattr(node.value, "id", None))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) in MUTATORS:
            written.add(getattr(node.func.value, "id", None))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "next" and node.args:
            written.add(getattr(node.args[0], "id", None))
    found = set()
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            value = node.value
            func = getattr(value, "func", None)
            made = getattr(func, "attr", None) or getattr(func, "id", None)
            mutable = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp))
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                name = getattr(target, "id", None)
                if name in rebound or ((mutable or made in STATEFUL) and name in written):
                    found.add(name)
    return found


def test_no_module_of_tasks_keeps_mutable_state_of_its_own() -> None:
    """STYLE.md rule 15: threads, caches and memories that live as long as a process are parts
    of its owner (`ProcessParts`), never module-level singletons."""
    root = Path(__file__).resolve().parent.parent
    found = {
        str(path.relative_to(root)): names
        for path in sorted((root / "tasks").rglob("*.py"))
        if (names := _module_state(path))
    }
    assert found == LEFT
