"""One owner for a process's long-lived parts (`tasks.process.parts`): made and started after
what they require, stopped in reverse, each once; and no module of `tasks/` keeps mutable
state of its own (the parts hold it)."""

from __future__ import annotations


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
