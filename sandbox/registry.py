"""The runtimes registered by name (the same shape as `core.registry`, with the sandbox's own
error: this package imports nothing of the service). Job specs and node settings are checked
against these names, so valid names are never restated by hand."""
from __future__ import annotations

from typing import Any

from sandbox.errors import UnknownRuntime

# Names that are not runtimes: "auto" picks one on the node, "none" means no sandbox.
CHOICES = ("auto", "none")
_REGISTRY: dict[str, Any] = {}  # name -> Runtime subclass


def register(name: str):
    """Class decorator adding a runtime under `name`; a duplicate name raises."""

    def add(cls: Any) -> Any:
        if name in _REGISTRY or name in CHOICES:
            raise UnknownRuntime(f"runtime {name!r} is already registered")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return add


def runtime_names() -> list[str]:
    """Registered runtime names (the built-in ones register when `sandbox` is imported)."""
    return sorted(_REGISTRY)


def registered(name: str) -> Any:
    """The runtime class registered as `name`, or None."""
    return _REGISTRY.get(name)


def check_runtime_name(name: str) -> str:
    """`name` if a job or a node may choose it; UnknownRuntime listing the valid ones."""
    if name not in CHOICES and name not in _REGISTRY:
        valid = ", ".join([*CHOICES, *runtime_names()])
        raise UnknownRuntime(f"unknown sandbox runtime {name!r}; valid: {valid}", runtime=name)
    return name
