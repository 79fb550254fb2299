"""`RolloutEndpoint`: one rollout's OpenAI/Anthropic-compatible model API on a Unix socket."""
from __future__ import annotations

import logging
import os
import secrets
from dataclasses import asdict, dataclass, field
from typing import Any

from agents.abstract import RunResult, StageContext

log = logging.getLogger(__name__)


@dataclass
class EndpointCounters:
    """What the endpoint counted for one rollout (the handler and the metrics read these)."""

    calls: int = 0
    failed_calls: int = 0  # answered with an API error (bad request, context, budget, ...)
    parse_failures: int = 0  # replies whose tool-call markup did not parse
    tool_calls: int = 0  # tool calls parsed and returned to the harness
    samples: int = 0
    merges: int = 0
    splits: int = 0
    split_reasons: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (merged into the rollout's metrics)."""
        return asdict(self)


class RolloutEndpoint:
    """One rollout's OpenAI/Anthropic-compatible model API, served on a Unix socket.

    `ctx` is the RUN stage's context (its `llm` session, `record_turn`, deadline, cancel
    check and limits); `token` is the per-attempt capability a call must present
    (`Authorization: Bearer` or `x-api-key`). The socket is bound on `__enter__` (mode 0666
    in a directory the runtime makes) and served by threads; `__exit__` stops serving and
    the token is dead from then on.
    """

    def __init__(self, ctx: StageContext, socket_path: str, token: str) -> None:
        if not token or len(token) < 16:
            raise ValueError("the endpoint's token must be a random string of 16+ characters")
        self.ctx = ctx
        self.socket_path = socket_path
        self.token = token
        self.counters = EndpointCounters()
        self._server: Any = None

    @staticmethod
    def new_token() -> str:
        """A fresh capability token for one rollout attempt."""
        return secrets.token_urlsafe(32)

    def __enter__(self) -> RolloutEndpoint:
        raise NotImplementedError  # filled in by the next commits

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server = None
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)

    @property
    def calls(self) -> int:
        """Model calls answered (successfully or with an API error)."""
        return self.counters.calls

    def result(self, outcome: str, finish_reason: str | None) -> RunResult:
        """The RunResult of the rollout: its last sample's arrays, every sample in `extra`."""
        raise NotImplementedError
