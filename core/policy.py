"""Operator policy: what a job spec may ask of this deployment.

The job spec comes over the network and is not trusted with the node; the operator's settings
are. `Policy` is the operator's part (a field of `Settings`, from `RAAS_POLICY__...` variables
or the file `RAAS_POLICY_FILE`); `check_sandbox_options` and friends hold a job's choices
against it and raise `InvalidRequest` naming the field and the rule, at submission (a 400) and
again on the worker before a sandbox starts (the worker's own settings decide).
"""

from __future__ import annotations

import fnmatch
import re
from functools import cached_property
from pathlib import Path
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Protocol

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from core.errors import InvalidRequest
from core.harnesses import HarnessPolicy, HarnessRegistration
from core.urls import UrlRule, parse_rule, url_refusal

RuntimeChoice = Literal["auto", "bwrap", "singularity", "local"]
# A registered name: never a path, never hidden, never `..`.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# Variables no job may set even inside a sandbox: they change how the loader and the
# interpreter of the tool server behave (and would reach host processes on `local`).
FORBIDDEN_ENV_PREFIXES = ("LD_", "PYTHON", "BASH_FUNC_")
FORBIDDEN_ENV_NAMES = ("ENV", "BASH_ENV", "PROMPT_COMMAND", "IFS")
MB = 1024 * 1024
DEFAULT_OWNER = "default"  # the one owner of a service without tokens (loopback only)


def _valid_rules(value: list[str]) -> list[str]:
    """Each entry parses as a URL rule (an old whole-URL glob is an error naming the format)."""
    for i, text in enumerate(value):
        try:
            parse_rule(text)
        except ValueError as exc:
            raise ValueError(f"[{i}]: {exc}") from None
    return value


# A list of URL rules `scheme://HOST[:PORT][/PATH]` (core.urls), checked when the policy loads.
UrlRules = Annotated[list[str], AfterValidator(_valid_rules)]


def parse_rules(texts: list[str]) -> list[UrlRule]:
    """URL rules, parsed (they were checked when the policy loaded)."""
    return [parse_rule(text) for text in texts]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LimitCaps(_Strict):
    """Upper bounds on a job's `sandbox.limits` (a request above is a 400 naming the cap)."""

    call_timeout: float = Field(3600.0, gt=0, description="Most wall seconds per tool call")
    memory_mb: int = Field(16384, gt=0, description="Most memory per sandbox, MiB")
    max_procs: int = Field(4096, ge=8, description="Most processes alive in one sandbox")
    output_bytes: int = Field(MB, ge=256, description="Most tool output kept per call, bytes")
    file_size_mb: int = Field(8192, gt=0, description="Largest file a sandbox may write, MiB")


class SandboxPolicy(_Strict):
    """What a job may choose about its sandboxes."""

    runtimes: list[RuntimeChoice] = Field(
        default_factory=lambda: ["bwrap"],
        description="Runtimes jobs may use; `auto` falls back to `local` only if it is listed",
    )
    network: bool = Field(False, description="Whether a job may turn the sandbox network on")
    env: list[str] = Field(
        default_factory=list, description="Names (or fnmatch patterns) of variables a job may set inside its sandbox"
    )
    python_envs: list[str] | None = Field(
        None, description="Python environments a job may name; None = any built on the node"
    )
    images: list[str] | None = Field(None, description="Images (under image_root) a job may name; None = any there")
    binds: bool = Field(False, description="Whether a job may bind host paths (trusted jobs)")
    max_limits: LimitCaps = Field(default_factory=LimitCaps, description="Caps on limits")

    @field_validator("env")
    @classmethod
    def _no_loader_variables(cls, value: list[str]) -> list[str]:
        for pattern in value:
            bad = forbidden_env(pattern)
            if bad:
                raise ValueError(f"env pattern {pattern!r} would allow {bad}: never allowed")
        return value

    @field_validator("python_envs", "images")
    @classmethod
    def _names(cls, value: list[str] | None) -> list[str] | None:
        for name in value or []:
            if not NAME_RE.match(name):
                raise ValueError(f"{name!r} is not a plain name")
        return value


class Credential(_Strict):
    """An inference-server credential the operator registers: where it lives, where it may go."""

    env: str = Field(min_length=1, description="Worker variable holding the secret")
    urls: UrlRules = Field(
        min_length=1, description="URL rules (core.urls) of the servers it is sent to (never anywhere else)"
    )

    @cached_property
    def rules(self) -> list[UrlRule]:
        """`urls`, parsed."""
        return parse_rules(self.urls)


class LLMPolicy(_Strict):
    """What a job may choose about inference servers, templates and credentials."""

    server_urls: UrlRules = Field(
        default_factory=list,
        description="URL rules `scheme://HOST[:PORT][/PATH]` (core.urls) of the servers a "
        "tenant may name or register (admins: any)",
    )
    templates_dir: Path | None = Field(None, description="Registered chat templates: `<name>.jinja` files a job names")
    inline_template_max_bytes: int = Field(
        65536, ge=0, description="Largest inline chat template (0 = inline text refused)"
    )
    credentials: dict[str, Credential] = Field(default_factory=dict, description="Credentials a job or server may name")
    tokenizer_roots: list[Path] = Field(
        default_factory=list,
        description="Folders a tenant's `llm.tokenizer` may name a tokenizer under (admins: "
        "any folder); otherwise the model path its servers report",
    )

    @cached_property
    def server_rules(self) -> list[UrlRule]:
        """`server_urls`, parsed."""
        return parse_rules(self.server_urls)


class Policy(_Strict):
    """The operator's policy for job specs; `GET /v1/policy` shows it (secrets excluded)."""

    sandbox: SandboxPolicy = Field(default_factory=SandboxPolicy, description="Sandboxes")
    llm: LLMPolicy = Field(default_factory=LLMPolicy, description="Inference servers")
    harnesses: HarnessPolicy = Field(
        default_factory=HarnessPolicy, description="Agent harnesses the `harness` agent may start"
    )
    callback_urls: UrlRules = Field(
        default_factory=list,
        description="URL rules `scheme://HOST[:PORT][/PATH]` (core.urls) of the callback URLs "
        "a tenant's job may name (admins: any): raas's own processes call them",
    )

    @cached_property
    def callback_rules(self) -> list[UrlRule]:
        """`callback_urls`, parsed."""
        return parse_rules(self.callback_urls)

    def public(self) -> dict[str, Any]:
        """The policy as a trainer may see it: credential names, never their variables."""
        data = self.model_dump(mode="json")
        data["llm"]["credentials"] = {name: {"urls": c.urls} for name, c in self.llm.credentials.items()}
        data["llm"]["templates"] = registered_templates(self.llm)
        data["llm"].pop("templates_dir")
        for harness in data["harnesses"]["registered"].values():  # names, not values
            harness["env"] = sorted(harness["env"])
            harness["files"] = sorted(harness["files"])  # paths, not their text
        return data


def forbidden_env(pattern: str) -> str | None:
    """The forbidden prefix a name or pattern could match, else None."""
    for prefix in FORBIDDEN_ENV_PREFIXES:
        if fnmatch.fnmatchcase(prefix + "X", pattern) or pattern.startswith(prefix):
            return f"{prefix}*"
    for name in FORBIDDEN_ENV_NAMES:
        if fnmatch.fnmatchcase(name, pattern):
            return name
    return None


def plain_name(value: str, field: str) -> str:
    """`value` if it is a registered-name shape; a 400 naming `field` otherwise."""
    if not NAME_RE.match(value):
        raise InvalidRequest(
            f"{field}: {value!r} is not a registered name (letters, digits, '.', '_', '-'; never a path)", field=field
        )
    return value


def registered_templates(llm: LLMPolicy) -> list[str]:
    """Names of the chat templates in the operator's template folder."""
    folder = llm.templates_dir
    if folder is None or not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.jinja") if NAME_RE.match(p.stem))


def _deny(field: str, message: str, rule: str) -> InvalidRequest:
    return InvalidRequest(f"{field}: {message} (operator policy: {rule})", field=field, policy=rule)


def runtime_allowed(policy: SandboxPolicy, runtime: str) -> bool:
    """True when jobs may run on `runtime` (`auto` counts as bwrap; `none` needs no sandbox)."""
    if runtime == "none" or runtime in policy.runtimes:
        return True
    return runtime == "auto" and "bwrap" in policy.runtimes


def local_fallback_allowed(policy: SandboxPolicy) -> bool:
    """Whether `auto` may fall back to the unisolated local runtime when bwrap is unusable."""
    return "local" in policy.runtimes


class ChosenLimits(Protocol):
    """A job's `sandbox.limits` (`sandbox.spec.SandboxLimits`): the ones it set are
    `model_fields_set`; the rest are defaults that come down to the caps, never judged."""

    model_fields_set: set[str]


class SandboxChoice(Protocol):
    """The sandbox options a job chose: `sandbox.spec.SandboxOptions`, typed here by shape
    because core imports nothing of the sandbox. What the job set is `model_fields_set`
    (a stored job holds only those: `agents.job_config.JobConfig.dump`)."""

    model_fields_set: set[str]
    runtime: str | None
    image: str | None
    python_env: str | None
    binds: Sequence[Any]
    env: Mapping[str, str]
    network: bool
    limits: ChosenLimits


def check_sandbox_options(policy: SandboxPolicy, options: SandboxChoice, where: str = "sandbox") -> None:
    """Hold a job's sandbox options against the policy; InvalidRequest names field and rule.

    Only what the job set is judged (an option left at its default is the service's)."""
    chosen = options.model_fields_set
    runtime = options.runtime if "runtime" in chosen else None
    if runtime is not None and not runtime_allowed(policy, runtime):
        raise _deny(
            f"{where}.runtime",
            f"runtime {runtime!r} is not allowed; allowed: {', '.join(policy.runtimes)}",
            "policy.sandbox.runtimes",
        )
    if "network" in chosen and options.network and not policy.network:
        raise _deny(f"{where}.network", "jobs may not turn the sandbox network on", "policy.sandbox.network=false")
    if "binds" in chosen and options.binds and not policy.binds:
        raise _deny(f"{where}.binds", "jobs may not bind host paths on this service", "policy.sandbox.binds=false")
    for name in options.env if "env" in chosen else ():
        check_env_name(policy, name, f"{where}.env.{name}")
    if "python_env" in chosen and options.python_env is not None:
        check_python_env(policy, options.python_env, f"{where}.python_env")
    if "image" in chosen and options.image is not None:
        check_image(policy, options.image, f"{where}.image")
    if "limits" in chosen:
        limits = options.limits
        check_limits(policy.max_limits, {n: getattr(limits, n) for n in limits.model_fields_set}, f"{where}.limits")


def check_env_name(policy: SandboxPolicy, name: str, field: str) -> None:
    """A variable a job sets inside its sandbox must be on the operator's allowlist."""
    bad = forbidden_env(name)
    if bad:
        raise _deny(
            field,
            f"variable {name!r} is never settable ({bad} changes the loader or interpreter)",
            "forbidden prefixes",
        )
    if not any(fnmatch.fnmatchcase(name, p) for p in policy.env):
        allowed = ", ".join(policy.env) or "none"
        raise _deny(field, f"variable {name!r} is not on the allowlist ({allowed})", "policy.sandbox.env")


def check_python_env(policy: SandboxPolicy, name: str, field: str) -> None:
    """A Python environment is named, never a host path, and on the list when there is one."""
    plain_name(name, field)
    if policy.python_envs is not None and name not in policy.python_envs:
        raise _deny(
            field,
            f"python environment {name!r} is not allowed; allowed: {', '.join(policy.python_envs) or 'none'}",
            "policy.sandbox.python_envs",
        )


def check_image(policy: SandboxPolicy, name: str, field: str) -> None:
    """An image is a name under the operator's image root, never a host path."""
    plain_name(name, field)
    if policy.images is not None and name not in policy.images:
        raise _deny(
            field,
            f"image {name!r} is not allowed; allowed: {', '.join(policy.images) or 'none'}",
            "policy.sandbox.images",
        )


def check_limits(caps: LimitCaps, limits: dict[str, Any], where: str) -> None:
    """Each requested limit at most the operator's cap; the 400 names the cap."""
    for name, cap in caps.model_dump().items():
        value = limits.get(name)
        if value is not None and value > cap:
            raise _deny(f"{where}.{name}", f"{value} is above the cap {cap}", f"policy.sandbox.max_limits.{name}={cap}")


def _check_allowed_url(
    url: str, rules: list[UrlRule], texts: list[str], *, admin: bool, field: str, kind: str, rule: str, nothing: str
) -> None:
    """A tenant's `kind` URL must match one of the operator's `rules` (written `texts`, the
    allowlist at `rule`; `nothing` says what an empty one means); admins may name any."""
    if admin:
        return
    why = url_refusal(url, rules)
    if why is None:
        return
    allowed = ", ".join(texts) or nothing
    raise _deny(field, f"{kind} url {url!r} is not allowed ({why}); allowed: {allowed}", rule)


def check_server_url(policy: LLMPolicy, url: str, admin: bool, field: str) -> None:
    """Tenants may name or register only URLs on the operator's allowlist; admins any."""
    _check_allowed_url(
        url,
        policy.server_rules,
        policy.server_urls,
        admin=admin,
        field=field,
        kind="server",
        rule="policy.llm.server_urls",
        nothing="none: use the registered pool",
    )


def check_callback_url(policy: Policy, url: str, admin: bool, field: str) -> None:
    """Tenants may name only callback URLs on the operator's allowlist; admins any."""
    _check_allowed_url(
        url,
        policy.callback_rules,
        policy.callback_urls,
        admin=admin,
        field=field,
        kind="callback",
        rule="policy.callback_urls",
        nothing="none",
    )


def check_credential(policy: LLMPolicy, name: str, url: str | None, field: str) -> Credential:
    """A credential is one the operator registered, sent only to the URLs it names."""
    cred = policy.credentials.get(name)
    if cred is None:
        known = ", ".join(sorted(policy.credentials)) or "none"
        raise _deny(field, f"unknown credential {name!r}; registered: {known}", "policy.llm.credentials")
    if url is not None and url_refusal(url, cred.rules) is not None:
        raise _deny(field, f"credential {name!r} may not be sent to {url!r}", f"policy.llm.credentials.{name}.urls")
    return cred


def tokenizer_allowed(policy: LLMPolicy, folder: str, admin: bool) -> bool:
    """May this caller's job load a tokenizer from `folder`? Admins any; tenants only under
    the operator's tokenizer roots, whether the folder is named in the job or reported by one
    of the tenant's own servers in GET /v1/models (judged before asking if it exists)."""
    if admin:
        return True
    real = Path(folder).resolve()
    return any(real.is_relative_to(Path(root).resolve()) for root in policy.tokenizer_roots)


def check_tokenizer(policy: LLMPolicy, folder: str | None, admin: bool) -> None:
    """A tenant names a tokenizer folder only under the operator's tokenizer roots; the answer
    is the same whether the folder exists or not (no existence oracle)."""
    if folder is None or tokenizer_allowed(policy, folder, admin):
        return
    roots = ", ".join(str(r) for r in policy.tokenizer_roots) or "none"
    raise _deny(
        "llm.tokenizer",
        f"{folder!r} is not under the operator's tokenizer roots "
        f"({roots}); leave it unset to use the model path your servers report",
        "policy.llm.tokenizer_roots",
    )


def chat_template_text(policy: LLMPolicy, name: str | None, inline: str | None) -> str | None:
    """The template a job asked for: a registered name, or inline text within the size cap."""
    if name is not None and inline is not None:
        raise InvalidRequest(
            "llm: give chat_template (a registered name) or chat_template_text (inline), not both",
            field="llm.chat_template",
        )
    if inline is not None:
        size = len(inline.encode())
        if size > policy.inline_template_max_bytes:
            raise _deny(
                "llm.chat_template_text",
                f"{size} bytes is above the cap {policy.inline_template_max_bytes}",
                "policy.llm.inline_template_max_bytes",
            )
        return inline
    if name is None:
        return None
    plain_name(name, "llm.chat_template")
    known = registered_templates(policy)
    if name not in known:  # names only: never a path, so no file's existence is revealed
        raise _deny(
            "llm.chat_template",
            f"unknown chat template {name!r}; registered: {', '.join(known) or 'none'}",
            "policy.llm.templates_dir",
        )
    return (policy.templates_dir / f"{name}.jinja").read_text()


def check_harness(
    policy: Policy, name: str, task: str, admin: bool, field: str = "agent_config.harness"
) -> HarnessRegistration:
    """A job names a registered harness fit for its task (tenants: one open to them, whose
    environment the sandbox policy allows); InvalidRequest names the rule otherwise."""
    plain_name(name, field)
    registered = policy.harnesses.registered
    harness = registered.get(name)
    if harness is None or not (admin or harness.tenants):
        known = ", ".join(sorted(n for n, h in registered.items() if admin or h.tenants))
        raise _deny(field, f"unknown harness {name!r}; registered: {known or 'none'}", "policy.harnesses.registered")
    if task not in harness.tasks:
        raise _deny(
            "agent_config.task",
            f"harness {name!r} does not run {task!r} tasks (it runs: {', '.join(harness.tasks)})",
            f"policy.harnesses.registered.{name}.tasks",
        )
    if harness.python_env is not None and not admin:
        check_python_env(policy.sandbox, harness.python_env, field)
    return harness
