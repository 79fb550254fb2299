"""Handlers registered by name; the name is also ProRL's `data_source`."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

from agents.abstract import AgentHandler
from core.errors import ConfigError
from core.registry import Registry

_builtin_loaded = False

# The package holding one sub-package per built-in handler (`<name>/handler.py` registers it).
BUILTIN_PACKAGE = "agents.handlers"


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
    for module in builtin_handler_modules():
        importlib.import_module(module)
    _builtin_loaded = True


def builtin_handler_modules() -> list[str]:
    """Each built-in handler's module: `<package>.handler` where the package has one, else the
    package (or a single-module handler) itself, whose import registers the handler."""
    package = importlib.import_module(BUILTIN_PACKAGE)
    modules = []
    for info in pkgutil.iter_modules(package.__path__):
        name = f"{BUILTIN_PACKAGE}.{info.name}"
        if info.ispkg and importlib.util.find_spec(f"{name}.handler") is not None:
            name += ".handler"
        modules.append(name)
    return modules


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
