"""LLM backends by name: `vllm`, `sglang`, `openai-chat` (text only, not token-exact)."""

from agents.llm.backends import openai_chat, sglang, vllm  # noqa: F401 - registers them
from agents.llm.backends.abstract import (
    BackendConfig,
    GenerateRequest,
    Generation,
    LLMBackend,
    ServerError,
    backend_config,
    backend_config_union,
    backend_names,
    get_backend_class,
    register_backend,
)

__all__ = [
    "BackendConfig",
    "GenerateRequest",
    "Generation",
    "LLMBackend",
    "ServerError",
    "backend_config",
    "backend_config_union",
    "backend_names",
    "get_backend_class",
    "register_backend",
]
