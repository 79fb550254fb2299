"""The long-lived parts of one process, owned by one object: made and started in a declared
order, stopped in reverse.

The shape is Celery's bootsteps (`celery/worker/consumer/`): one `Step` per concern says what
part it makes and which parts it `requires`; `ProcessParts` orders the steps so every part comes
after what it requires, makes them in that order (a part that needs another is handed it by its
step), starts them in that order and stops them in reverse. Nothing here knows a concrete part:
each part's type lives in its wing, and the processes compose their steps where they start
(`tasks.worker` for a stage pool, the gateway's factory, the reaper). Code that runs in such a
process reaches a part through the owner (`ProcessParts.get`), which a stage pool and the gateway
hang on their Celery app as `app.raas_parts`, never through a module-level singleton.

A part's own `start()` and `stop()` are what a step runs unless it says otherwise (`start=` and
`stop=` take the part and the owner, like a bootstep's `start(parent)`). A part without them (a
cache, a memory of cancelled jobs) is only made.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)
P = TypeVar("P")


def _own_start(part: Any, _parts: ProcessParts) -> None:
    if hasattr(part, "start"):
        part.start()


def _own_stop(part: Any, _parts: ProcessParts) -> None:
    if hasattr(part, "stop"):
        part.stop()


@dataclass(frozen=True)
class Step(Generic[P]):
    """How a process makes one long-lived part and which parts must come before it."""

    kind: type[P]  # the part's type: what `ProcessParts.get` finds it by
    make: Callable[[ProcessParts], P]  # builds the part; may `get` the parts it requires
    requires: tuple[type, ...] = ()  # kinds made and started before this one, stopped after it
    start: Callable[[P, ProcessParts], None] = _own_start
    stop: Callable[[P, ProcessParts], None] = _own_stop


class MissingPart(LookupError):
    """A part was asked for that this process does not have (or a step requires one)."""


def ordered(steps: Iterable[Step]) -> list[Step]:
    """`steps` so that each comes after every step it requires (declared order otherwise);
    MissingPart for a requirement no step makes, ValueError for a circle."""
    by_kind: dict[type, Step] = {}
    for step in steps:
        if step.kind in by_kind:
            raise ValueError(f"two steps make {step.kind.__name__}")
        by_kind[step.kind] = step
    done: list[Step] = []
    visiting: set[type] = set()

    def visit(step: Step) -> None:
        if step in done:
            return
        if step.kind in visiting:
            raise ValueError(f"steps require each other in a circle through {step.kind.__name__}")
        visiting.add(step.kind)
        for kind in step.requires:
            if kind not in by_kind:
                raise MissingPart(f"{step.kind.__name__} requires {kind.__name__}, which no step makes")
            visit(by_kind[kind])
        visiting.discard(step.kind)
        done.append(step)

    for step in by_kind.values():
        visit(step)
    return done


class ProcessParts:
    """The long-lived parts of one process (threads, caches, publishers), made from `steps`.

    `start` runs once, in step order; `stop` stops what started, in reverse, each part once,
    a failing stop logged and the next one stopped anyway. `shutting_down` is set from the
    first `stop` on (a stage pool also sets it when Celery starts its shutdown): a sandbox that
    dies from then on died with the process, not by its agent (`tasks.sandboxing.run_guard`).
    `consumer` is what the process consumes with once it is ready (a stage pool's Celery
    consumer), for the steps that act on it."""

    def __init__(self, steps: Iterable[Step]) -> None:
        self.steps = ordered(steps)
        self.shutting_down = threading.Event()
        self.consumer: Any = None
        self._parts: dict[type, Any] = {}
        self._started: list[Step] = []
        self._lock = threading.Lock()
        for step in self.steps:
            self._parts[step.kind] = step.make(self)

    def get(self, kind: type[P]) -> P:
        """This process's part of type `kind`; MissingPart (naming the ones it has) if none."""
        try:
            return self._parts[kind]
        except KeyError:
            have = ", ".join(k.__name__ for k in self._parts) or "none"
            raise MissingPart(f"this process has no {kind.__name__} (its parts: {have})") from None

    def has(self, kind: type) -> bool:
        """Whether this process has a part of type `kind`."""
        return kind in self._parts

    def start(self, consumer: Any = None) -> ProcessParts:
        """Start every part in step order (once; `consumer`: see the class doc)."""
        with self._lock:
            if self._started:
                return self
            self.consumer = consumer
            for step in self.steps:
                step.start(self._parts[step.kind], self)
                self._started.append(step)
        return self

    def stop(self) -> None:
        """Stop what started, in reverse order (once each)."""
        self.shutting_down.set()
        with self._lock:
            started, self._started = self._started, []
        for step in reversed(started):
            try:
                step.stop(self._parts[step.kind], self)
            except Exception:  # noqa: BLE001 - the parts after it must still stop
                log.exception("stopping %s failed", step.kind.__name__)

    def names(self) -> list[str]:
        """The parts' type names in start order (logs, tests)."""
        return [step.kind.__name__ for step in self.steps]
