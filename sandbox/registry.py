"""The runtimes registered by name (the same shape as `core.registry`, with the sandbox's own
error: this package imports nothing of the service). Job specs and node settings are checked
against these names, so valid names are never restated by hand.

Each runtime declares its config model (a `RuntimeConfig` whose `type` is a one-value
`Literal`, its name); the registry collects them, and `config_union()` is the discriminated
union a job chooses from, built from the registry as SWE-ReX builds its deployment configs.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Any, Union

from pydantic import Field, TypeAdapter, ValidationError

from sandbox.errors import UnknownRuntime

# Names that are not runtimes: "auto" picks one on the node, "none" means no sandbox.
CHOICES = ("auto", "none")
_REGISTRY: dict[str, Any] = {}  # name -> Runtime subclass
_CONFIGS: dict[str, Any] = {}  # name -> its RuntimeConfig subclass


def config_type(config: Any) -> str:
    """The name a config model declares: the default of its `type` Literal field."""
    return config.model_fields["type"].default


def register(config: Any):
    """Class decorator adding a runtime under the name its `config` model declares (`type`);
    a duplicate name raises."""
    name = config_type(config)

    def add(cls: Any) -> Any:
        if name in _REGISTRY or name in CHOICES:
            raise UnknownRuntime(f"runtime {name!r} is already registered")
        cls.name = name
        cls.config = config
        _REGISTRY[name] = cls
        _CONFIGS[name] = config
        return cls

    return add


def config_union() -> Any:
    """The registered runtime configs as one union discriminated on `type`."""
    configs = tuple(_CONFIGS[name] for name in runtime_names())
    if len(configs) == 1:
        return configs[0]
    return Annotated[Union[configs], Field(discriminator="type")]  # noqa: UP007 - built at run time


@lru_cache(maxsize=8)
def _adapter(names: tuple[str, ...]) -> TypeAdapter:
    return TypeAdapter(config_union())


def runtime_config(value: Any) -> Any:
    """The config model of a runtime chosen as a name (`"bwrap"`, as on the wire today) or as
    a mapping with `type`; an unknown name raises UnknownRuntime listing the valid ones."""
    data = {"type": value} if isinstance(value, str) else value
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise UnknownRuntime(f"a sandbox runtime is a name or a mapping with 'type', not {value!r}")
    name = data["type"]
    if name in CHOICES or name not in _REGISTRY:
        valid = ", ".join(runtime_names())
        raise UnknownRuntime(f"unknown sandbox runtime {name!r}; valid: {valid}", runtime=name)
    try:
        return _adapter(tuple(runtime_names())).validate_python(data)
    except ValidationError as exc:
        raise UnknownRuntime(f"bad config for sandbox runtime {name!r}: {exc}", runtime=name) from None


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
