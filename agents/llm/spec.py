"""The job's `llm` and `sampling` configs, validated once at submission time.

`LLMSpec` says where generation happens (the job's own servers, or the registered pool when
`servers` is None), which backend speaks to them and which tokenizer builds the trajectory.
`SamplingParams` is per turn. Both forbid unknown fields so a typo fails the submission with a
message naming the field instead of being ignored for a whole batch.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from core.errors import InvalidRequest
from core.urls import parse_url
from core.policy import (
    LLMPolicy,
    chat_template_text,
    check_credential,
    check_server_url,
    check_tokenizer,
    tokenizer_allowed,
)


def _registered_backend(value: Any) -> Any:
    """A backend is a registered name, or its config (`{"type": "vllm"}`, validated against
    the union the registry builds), stored by its name as a name on the wire always was.
    An unknown one is a RegistryError listing the valid ones."""
    from agents.llm.backends import backend_config

    return backend_config(value).type if isinstance(value, (str, dict)) else value


# A registered LLM backend (checked against the registry, not restated here).
BackendName = Annotated[str, BeforeValidator(_registered_backend)]

# vLLM's --logprobs-mode values that are logprobs (the *_logits modes are not): raw = the
# model's distribution before temperature/top-k/top-p and logit processors (vLLM's default),
# processed = the distribution actually sampled from, after all of them.
LogprobsMode = Literal["raw_logprobs", "processed_logprobs"]


class ServerSpec(BaseModel):
    """One inference server named by the job itself (instead of the registered pool)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="Base URL, e.g. http://10.0.0.5:8000")
    model: str | None = Field(None, description="Served model name; default: GET /v1/models")
    weight_version: str | None = Field(None, description="Recorded with every turn it samples")
    backend: BackendName | None = Field(None, description="Overrides the job's backend")
    credential: str | None = Field(None, description="Name of an operator-registered credential sent to this server")
    logprobs_mode: LogprobsMode = Field(
        "raw_logprobs",
        description="The server's --logprobs-mode (vLLM default raw_logprobs); recorded on every turn it samples",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"url {value!r} must start with http:// or https://")
        try:
            parse_url(value)  # strict: no spaces, control characters, bad host or port
        except ValueError as exc:
            raise ValueError(f"url {value!r} {exc}") from None
        # Servers are stored by base URL; ProRL and OpenAI-style clients often add `/v1`.
        return value.rstrip("/").removesuffix("/v1")


class LLMSpec(BaseModel):
    """Where and how a job's rollouts generate; stored normalised with the job."""

    model_config = ConfigDict(extra="forbid")

    servers: list[ServerSpec] | None = Field(
        None, description="The job's own servers; None = the registered pool (llm_servers)"
    )
    backend: BackendName = Field("vllm", description="Wire protocol of the servers")
    tokenizer: str | None = Field(
        None, description="Local Hugging Face folder; default: the model path the server reports"
    )
    chat_template: str | None = Field(None, description="Name of an operator-registered chat template (GET /v1/policy)")
    chat_template_text: str | None = Field(None, description="Inline Jinja chat template (size-capped by the operator)")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra template variables (e.g. enable_thinking)"
    )
    max_model_len: int = Field(4096, gt=0, description="Prompt + all turns, in tokens")
    request_timeout: float = Field(600.0, gt=0, description="Seconds for one generation call")
    credential: str | None = Field(None, description="Name of an operator-registered credential for the job's servers")
    logprobs_mode: LogprobsMode | None = Field(
        None,
        description="Only use servers whose logprobs are of this kind (raw_logprobs or "
        "processed_logprobs); None = any (the rollout records which)",
    )

    @field_validator("servers")
    @classmethod
    def _non_empty(cls, value: list[ServerSpec] | None) -> list[ServerSpec] | None:
        if value is not None and not value:
            raise ValueError("servers must list at least one server, or be null for the pool")
        return value

    @property
    def token_exact(self) -> bool:
        """False only for the text-only chat backend (API models, evaluation)."""
        return self.backend != "openai-chat"


class SamplingParams(BaseModel):
    """Per-turn sampling settings sent with every generation request."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(1.0, ge=0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass")
    top_k: int = Field(-1, ge=-1, description="-1 = all tokens")
    max_tokens: int = Field(1024, gt=0, description="Most tokens per turn (also capped by context)")
    stop: list[str] | None = Field(None, description="Extra stop strings")
    seed: int | None = Field(None, description="Per-request seed, for reproducible sampling")


def parse_model(model: type[BaseModel], data: dict | None, where: str) -> Any:
    """Validate `data` against `model`, turning pydantic errors into InvalidRequest."""
    try:
        return model.model_validate(data or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in (where, *first["loc"]))
        raise InvalidRequest(f"{field}: {first['msg']}", field=field) from exc


def validate_sampling(sampling: dict | None) -> dict:
    """The normalised sampling dict of a job; InvalidRequest names the bad field."""
    return parse_model(SamplingParams, sampling, "sampling").model_dump()


def validate_llm_spec(
    llm_spec: dict, registered: Callable[[], list[str]] = list, policy: LLMPolicy | None = None, admin: bool = True
) -> dict:
    """`resolve_llm_spec` of a spec given as JSON, returned as JSON (InvalidRequest names
    the bad field)."""
    return resolve_llm_spec(parse_model(LLMSpec, llm_spec, "llm"), registered, policy, admin).model_dump()


def resolve_llm_spec(
    parsed: LLMSpec,
    registered: Callable[[], list[str]] = list,
    policy: LLMPolicy | None = None,
    admin: bool = True,
    owner: str = "",
) -> LLMSpec:
    """Hold a job's parsed `llm` spec to the operator's policy at submission and resolve its
    tokenizer folder and chat template text; returns the spec the job stores (a copy: the
    request's own is left as it came).

    The job's own server URLs must be on the operator's allowlist (admins: any), credentials
    registered for those URLs, the template a registered name or capped inline text. The
    tokenizer is the named folder, else the model path a server (the job's, else one of
    `registered()`, the caller's owner's) reports in GET /v1/models when that folder exists
    locally; otherwise InvalidRequest names `llm.tokenizer`. An inline template is checked in
    `owner`'s turn (`template_checker.CheckerPool`).
    """
    from jinja2 import TemplateError

    from agents.llm.template_checker import check_untrusted_template
    from agents.llm.tokenizer import load_chat_tokenizer, resolve_tokenizer_path

    policy = policy or LLMPolicy()
    inline = parsed.chat_template_text is not None  # a registered template is the operator's
    spec = check_llm_policy(parsed.model_copy(deep=True), policy, admin)
    for i, server in enumerate(spec.servers or []):
        if spec.logprobs_mode is not None and server.logprobs_mode != spec.logprobs_mode:
            raise InvalidRequest(
                f"llm.servers.{i}.logprobs_mode: the job asks for {spec.logprobs_mode} but "
                f"{server.url} declares {server.logprobs_mode} (vLLM --logprobs-mode)",
                field=f"llm.servers.{i}.logprobs_mode",
            )
    spec.tokenizer = resolve_tokenizer_path(
        spec, registered, None if admin else partial(tokenizer_allowed, policy, admin=False)
    )
    if spec.chat_template_text is not None and inline:
        check_untrusted_template(spec.tokenizer, spec.chat_template_text, owner)  # a bounded child
    try:
        load_chat_tokenizer(spec.tokenizer, spec.chat_template_text)
    except TemplateError as exc:
        raise InvalidRequest(
            f"llm.chat_template_text: the template is invalid or unsafe: {exc}", field="llm.chat_template_text"
        ) from exc
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"llm.tokenizer: cannot load {spec.tokenizer!r}: {exc}") from exc
    return spec


def check_llm_policy(spec: LLMSpec, policy: LLMPolicy, admin: bool) -> LLMSpec:
    """Hold the spec's servers, credentials and template to the policy; the template's
    text replaces its registered name (workers need no template folder)."""
    for i, server in enumerate(spec.servers or []):
        check_server_url(policy, server.url, admin, f"llm.servers[{i}].url")
        for name, where in ((server.credential, f"llm.servers[{i}].credential"), (spec.credential, "llm.credential")):
            if name is not None:
                check_credential(policy, name, server.url, where)
    if spec.credential is not None and not spec.servers:
        raise InvalidRequest(
            "llm.credential: the registered pool's servers carry their own credentials; name one only with llm.servers",
            field="llm.credential",
        )
    check_tokenizer(policy, spec.tokenizer, admin)
    spec.chat_template_text = chat_template_text(policy, spec.chat_template, spec.chat_template_text)
    spec.chat_template = None
    return spec
