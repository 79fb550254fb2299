"""Handlers registered by name; the name is also ProRL's `data_source`."""
from __future__ import annotations

import importlib

from agents.abstract import AgentHandler
from core.errors import ConfigError
from core.registry import Registry

_builtin_loaded = False

# Modules whose import registers the built-in handlers.
BUILTIN_MODULES = ("agents.handlers",)


def register(cls: type[AgentHandler]) -> type[AgentHandler]:
    """Class decorator: register a handler under `cls.name`; a duplicate name raises."""
    name = getattr(cls, "name", None)
    if not name:
        raise ConfigError(f"handler {cls.__name__} has no name")
    HANDLERS.add(name, cls())
    return cls


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
HANDLERS: Registry[AgentHandler] = Registry("agent", "agent", load_builtin_handlers)


def handler_names() -> list[str]:
    """Sorted names of every registered handler."""
    return HANDLERS.names()


def get_handler(name: str) -> AgentHandler:
    """The handler registered as `name`; an unknown name lists the valid ones."""
    return HANDLERS.get(name)


def declared_environments() -> dict[str, list[str]]:
    """Environment name -> pip packages, as declared by the registered handlers."""
    declared: dict[str, list[str]] = {}
    for _name, handler in HANDLERS:
        for env, packages in handler.environments.items():
            declared.setdefault(env, sorted(packages))
    return declared
