"""Test-only handler whose INIT crashes its worker's consumer (RAAS_HANDLER_MODULES).

The fault is injected at the narrowest point: a callback that raises inside the consumer's
own loop, the way kombu's AttributeError on an ack did during a Redis restart (issue 15).
Everything around it is real: the Celery worker process, its consumer, the exit code.
"""

from __future__ import annotations

from typing import Any

from celery.signals import worker_ready

from agents.abstract import EvalResult, HandlerConfig, Trajectory
from agents.contexts import EvalContext, InitContext, RunContext
from agents.registry import register
from bench.support.pipeline_handlers import SleepyHandler

_consumer: dict[str, Any] = {}


@worker_ready.connect(weak=False)
def _remember(sender: Any = None, **_: Any) -> None:
    _consumer["it"] = sender  # the worker's Consumer


def _crash() -> None:
    raise AttributeError("'NoneType' object has no attribute 'hostname'")


@register
class ConsumerCrashHandler(SleepyHandler):
    """INIT schedules a raising callback on its worker's consumer loop."""

    name = "test-consumer-crash"
    Config = HandlerConfig

    def init(self, ctx: InitContext) -> None:
        _consumer["it"].call_soon(_crash)

    def run(self, ctx: RunContext) -> Trajectory:
        raise AssertionError("never reached")

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        raise AssertionError("never reached")
