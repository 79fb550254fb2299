"""Agent handlers: the interface, the registry, the shared multi-turn loop and the handlers.

`get_handler(name)` returns the registered handler; each built-in handler's module
(`agents/handlers/<name>/handler.py`) registers it when imported (see
`agents.registry.load_builtin_handlers`).
"""

from agents.abstract import AgentHandler, EvalResult, HandlerConfig, Trajectory
from agents.contexts import EvalContext, InitContext, RolloutContext, RunContext
from agents.registry import get_handler, handler_names, register

__all__ = [
    "AgentHandler",
    "EvalContext",
    "EvalResult",
    "HandlerConfig",
    "InitContext",
    "RolloutContext",
    "RunContext",
    "Trajectory",
    "get_handler",
    "handler_names",
    "register",
]
