"""Handlers registered by name; the name is also ProRL's `data_source`."""
from __future__ import annotations

import importlib
import threading

from agents.base import AgentHandler
from core.errors import ConfigError, InvalidRequest

_handlers: dict[str, AgentHandler] = {}
_lock = threading.Lock()
_builtin_loaded = False

# Modules whose import registers the built-in handlers.
BUILTIN_MODULES = ("agents.handlers",)


def register(cls: type[AgentHandler]) -> type[AgentHandler]:
    """Class decorator: register a handler under `cls.name`; a duplicate name raises."""
    name = getattr(cls, "name", None)
    if not name:
        raise ConfigError(f"handler {cls.__name__} has no name")
    with _lock:
        if name in _handlers:
            raise ConfigError(f"agent handler {name!r} is already registered")
        _handlers[name] = cls()
    return cls


def unregister(name: str) -> None:
    """Remove a handler (tests that register throwaway handlers)."""
    with _lock:
        _handlers.pop(name, None)


def load_builtin_handlers() -> None:
    """Import the modules that register the built-in handlers (once per process)."""
    global _builtin_loaded
    if _builtin_loaded:
        return
    for module in BUILTIN_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    _builtin_loaded = True


def load_handler_modules(modules: str | list[str]) -> None:
    """Import extra handler modules named in settings (comma-separated or a list)."""
    names = modules.split(",") if isinstance(modules, str) else modules
    for name in (n.strip() for n in names):
        if name and name not in _loaded_extra:
            importlib.import_module(name)
            _loaded_extra.add(name)


_loaded_extra: set[str] = set()


def handler_names() -> list[str]:
    """Sorted names of every registered handler."""
    load_builtin_handlers()
    return sorted(_handlers)


def get_handler(name: str) -> AgentHandler:
    """The handler registered as `name`; an unknown name lists the valid ones."""
    load_builtin_handlers()
    try:
        return _handlers[name]
    except KeyError:
        valid = ", ".join(sorted(_handlers)) or "(none)"
        raise InvalidRequest(f"unknown agent {name!r}; valid agents: {valid}",
                             field="agent", valid=sorted(_handlers)) from None


def declared_environments() -> dict[str, list[str]]:
    """Environment name -> pip packages, as declared by the registered handlers."""
    load_builtin_handlers()
    declared: dict[str, list[str]] = {}
    for name in sorted(_handlers):
        for env, packages in _handlers[name].environments.items():
            declared.setdefault(env, sorted(packages))
    return declared
