"""`harness`: an operator-registered, unmodified agent harness run in the rollout's sandbox.

`handler` holds the handler (INIT/EVAL reuse the task kind's handler: swe, math, code);
`launch` renders the registration into the task text, argv and variables and waits for
the harness. The endpoint it talks to is `agents.harness.RolloutEndpoint`; the bridge from the
sandbox to it is `sandbox.bridge`; registrations live in the policy (`core.harnesses`).
"""

from agents.handlers.harness.handler import HarnessConfig, HarnessHandler

__all__ = ["HarnessConfig", "HarnessHandler"]
