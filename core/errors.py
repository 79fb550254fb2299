"""One exception hierarchy for the whole project.

Every error raised on purpose derives from `RaasError` and, where one fits, from the matching
built-in so callers can catch either. The gateway maps them to HTTP codes in one place
(`app.api.errors`); `http_status` and `code` travel with the class.

    RaasError (500)
    ├── InvalidRequest, ValueError (400)
    │   ├── PayloadTooLarge (413)
    │   ├── TiedEmbeddings (422)              a tied checkpoint sent to a weight push
    │   ├── core.registry.RegistryError       unknown or duplicate name
    │   └── agents.llm.template_budget.TemplateOverBudget
    ├── Unauthorized, PermissionError (401)
    ├── Forbidden, PermissionError (403)
    ├── NotFound, LookupError (404)
    │   └── agents.handlers.swe.repo.NotProvisioned
    ├── Conflict (409)
    │   ├── PauseTimeout                      a pool pause that outlived its timeout
    │   └── WeightPushFailed                  a push that did not verify (the pool stays paused)
    ├── ConfigError, ValueError               a bad operator setting (start-up), not a request
    ├── ServiceUnavailable, ConnectionError (503)
    │   ├── agents.llm.backends.abstract.ServerError
    │   ├── agents.llm.pool.ServersPaused
    │   └── app.api.prorl.ServerNotRunning
    ├── StageTimeout, TimeoutError
    ├── RolloutCancelled
    ├── LeaseLost
    ├── InfraError                            never graded: retried, then `infra_error`
    ├── ResumeError
    ├── AgentError                            the policy's own failure: reward 0
    ├── QuotaExceeded (429)
    └── agents.llm.trajectory.TrajectoryError, ValueError

`sandbox/` stands alone with its own root, `sandbox.errors.SandboxError` (SandboxStartError,
SandboxTampered, SandboxTimeout, SandboxGone, UnknownRuntime, ProtocolError); the stages map
those onto the classes above.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import ValidationError


class RaasError(Exception):
    """Root of every error raas raises on purpose."""

    http_status = 500
    code = "internal_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        """The JSON body sent to API clients."""
        body: dict[str, Any] = {"error": self.code, "message": self.message}
        if self.details:
            body["details"] = self.details
        return body


class InvalidRequest(RaasError, ValueError):
    """The caller sent something we cannot accept (bad field, unknown name, bad shape)."""

    http_status = 400
    code = "invalid_request"


class Unauthorized(RaasError, PermissionError):
    """Missing or wrong API token."""

    http_status = 401
    code = "unauthorized"


class Forbidden(RaasError, PermissionError):
    """The caller is known but may not do this (an operator route, say)."""

    http_status = 403
    code = "forbidden"


class NotFound(RaasError, LookupError):
    """The addressed job, rollout or server does not exist."""

    http_status = 404
    code = "not_found"


class Conflict(RaasError):
    """The request clashes with current state (already running, duplicate url, ...)."""

    http_status = 409
    code = "conflict"


class PayloadTooLarge(InvalidRequest):
    """The request body is larger than the configured limit."""

    http_status = 413
    code = "payload_too_large"


class ConfigError(RaasError, ValueError):
    """A setting or a job/handler config is invalid; raised at start-up or at submission."""

    http_status = 400
    code = "config_error"


class ServiceUnavailable(RaasError, ConnectionError):
    """A backing service (database, broker, inference server) cannot be reached."""

    http_status = 503
    code = "service_unavailable"


class StageTimeout(RaasError, TimeoutError):
    """A stage ran past its deadline."""

    http_status = 504
    code = "stage_timeout"


class RolloutCancelled(RaasError):
    """The rollout was cancelled; raised at a cooperative check point to unwind a stage."""

    http_status = 409
    code = "cancelled"


class LeaseLost(RaasError):
    """This worker no longer owns the rollout (the reaper gave it to a new attempt): stop
    without writing anything more."""

    http_status = 409
    code = "lease_lost"


class InfraError(RaasError):
    """The infrastructure failed (sandbox, LLM server, worker); never the agent's fault."""

    code = "infra_error"


class ResumeError(RaasError):
    """Stored turns cannot rebuild the RUN exactly (gaps, another template or tokenizer):
    the rollout restarts from INIT instead of continuing from a trajectory it did not have."""

    code = "resume_error"


class ReplayDiverged(ResumeError):
    """A tool call replayed into a rebuilt sandbox gave another output than the logged one,
    and the job chose to start over (`resume.on_divergence: restart`); `details["divergences"]`
    says which turn and call differed."""

    code = "replay_diverged"


class AgentError(RaasError):
    """The agent misbehaved in a way that ends the rollout (e.g. no valid action in N turns)."""

    code = "agent_error"


class PauseTimeout(Conflict):
    """A pool pause did not drain its in-flight generations in time; the servers stay paused."""

    code = "pause_timeout"


class WeightPushFailed(Conflict):
    """A weight push could not be verified on every server; the pool stays paused."""

    code = "weight_push_failed"


class TiedEmbeddings(InvalidRequest):
    """A checkpoint ties lm_head to the embeddings: an in-place reload would keep the old head."""

    http_status = 422
    code = "tied_embeddings"


class QuotaExceeded(RaasError):
    """The request is within bounds but the owner's share is used up; retry later."""

    http_status = 429
    code = "quota_exceeded"


def validation_error(exc: ValidationError, where: str = "body") -> InvalidRequest:
    """A pydantic error as an InvalidRequest naming the first bad field."""
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or where
    return InvalidRequest(
        f"{loc}: {first['msg']}",
        field=loc,
        errors=[{"field": ".".join(str(p) for p in e["loc"]), "message": e["msg"]} for e in exc.errors()[:20]],
    )
