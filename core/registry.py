"""One registry helper for the plug-in families: implementations kept by name.

A duplicate name raises, and so does an unknown one, whose message lists the valid names; both
are `RegistryError`. Agent handlers (`agents/registry.py`) and LLM backends
(`agents/llm/backends/abstract.py`) use it. Sandbox runtimes (`sandbox/registry.py`) keep the
same shape with their own errors, because the sandbox package imports nothing of ours.

Where a config chooses one of several implementations (LLM backends, sandbox runtimes), each
implementation declares a config model whose `type` is a one-value Literal (its name), and
`config_union` joins the registered ones into a discriminated union.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Generic, TypeVar, Union

from pydantic import BaseModel, Field

from core.errors import InvalidRequest

T = TypeVar("T")


def config_type(config: type[BaseModel]) -> str:
    """The name a config model declares: the default of its one-value `type` Literal."""
    return config.model_fields["type"].default


def config_union(configs: list[type[BaseModel]]) -> Any:
    """The config models of a family's implementations as one union discriminated on `type`
    (SWE-ReX's deployment-config shape), built from the registry rather than written out."""
    if len(configs) == 1:
        return configs[0]
    return Annotated[Union[tuple(configs)], Field(discriminator="type")]  # noqa: UP007


class RegistryError(InvalidRequest):
    """A plug-in name that is registered twice, or that is unknown (the valid ones listed)."""


class Registry(Generic[T]):
    """Named implementations of one family (`family` is how messages call one of them)."""

    def __init__(self, family: str, field: str, load: Callable[[], None] | None = None) -> None:
        self.family = family
        self.field = field  # the request field that names one (e.g. "agent", "llm.backend")
        self._load = load or (lambda: None)  # imports the built-in implementations
        self._items: dict[str, T] = {}
        self._lock = threading.Lock()

    def add(self, name: str, item: T) -> T:
        """Register `item` under `name`; a duplicate name raises RegistryError."""
        with self._lock:
            if name in self._items:
                raise RegistryError(f"{self.family} {name!r} is already registered", field=self.field)
            self._items[name] = item
        return item

    def get(self, name: str) -> T:
        """The implementation registered as `name`; an unknown name lists the valid ones."""
        self._load()
        try:
            return self._items[name]
        except KeyError:
            valid = self.names()
            raise RegistryError(
                f"unknown {self.family} {name!r}; valid {self.family}s: {', '.join(valid) or '(none)'}",
                field=self.field,
                valid=valid,
            ) from None

    def names(self) -> list[str]:
        """Sorted registered names (what a config may name)."""
        self._load()
        return sorted(self._items)

    def __iter__(self) -> Iterator[tuple[str, T]]:
        self._load()
        return iter(sorted(self._items.items()))
