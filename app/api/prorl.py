"""ProRL-Agent-compatible routes, so trainers integrated with ProRL work unchanged.

`/process` runs one rollout through the same pipeline as `/v1/jobs` and blocks until it ends;
the answer has ProRL's field names (and the token arrays NeMo Gym's adapter reads). ProRL's
`job_id` groups many `/process` calls so `/cancel` can stop them together.
"""
from __future__ import annotations

import time
import uuid
from typing import Any

from flask import Blueprint, current_app, g
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select

from app.api.jobs import enqueue_rollouts
from app.api.llm_servers import clear_servers, register_server
from app.api.routing import typed_route
from app.db import session_scope
from app.errors import InvalidRequest, StageTimeout
from app.jobs import cancel_job, create_job
from app.models import TERMINAL_VALUES, Job, LLMServer, Rollout, Turn
from app.schemas import Instance, JobCreate, LLMServerCreate

bp = Blueprint("prorl", __name__)


# ProRL's dataset names for what raas calls agents; any other data_source is an agent name.
DATA_SOURCE_ALIASES = {"swebench": "swe", "swe-bench": "swe", "swe_bench": "swe",
                       "swe-gym": "swe", "swe_gym": "swe", "r2e-gym": "swe", "r2e_gym": "swe",
                       "stem": "search"}


class ProcessRequest(BaseModel):
    """POST /process body, as ProRL sends it."""

    model_config = ConfigDict(extra="allow")

    instance: dict[str, Any] = Field(description="Task instance with `data_source` = agent")
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    job_id: str | None = None


class AddServer(BaseModel):
    """POST /add_llm_server body."""

    address: str = Field(min_length=1)


class CancelRequest(BaseModel):
    """POST /cancel body."""

    job_id: str = Field(min_length=1)


def _flag():
    """ProRL's started/stopped flag (the pipeline itself always runs; /process ignores it)."""
    return current_app.extensions.setdefault("prorl_running", __import__("threading").Event())


def _sampling(params: dict[str, Any]) -> dict[str, Any]:
    out = {k: params[k] for k in ("temperature", "top_p", "top_k", "stop", "seed") if k in params}
    tokens = params.get("max_tokens", params.get("max_new_tokens"))
    if tokens is not None:
        out["max_tokens"] = tokens
    return out


@typed_route(bp, "/process", "POST", body=ProcessRequest, summary="Run one rollout (blocking)",
             tag="prorl")
def process(body: ProcessRequest) -> dict[str, Any]:
    settings = current_app.config["RAAS"]
    inst = dict(body.instance)
    source = str(inst.pop("data_source", None) or "swebench")  # ProRL's default dataset
    agent = DATA_SOURCE_ALIASES.get(source.lower(), source)
    instance_id = str(inst.get("instance_id") or uuid.uuid4().hex)
    req = JobCreate(agent=agent, instances=[Instance(instance_id=instance_id, data=inst)],
                    sampling=_sampling(body.sampling_params), llm={})
    accepted = create_job(settings, req, g.owner, enqueue_rollouts)
    if body.job_id:
        with session_scope(settings.db_url) as s:
            job = s.get(Job, accepted.job_id)
            job.config = {**job.config, "prorl_job_id": body.job_id}
    rollout = _wait_terminal(settings.db_url, accepted.rollout_ids[0], settings.process_max_wait)
    with session_scope(settings.db_url) as s:
        turns = s.scalars(select(Turn).where(Turn.rollout_id == rollout.id,
                                             Turn.attempt == rollout.attempt)
                          .order_by(Turn.index)).all()
    return prorl_result(rollout, list(turns))


def _wait_terminal(db_url: str, rollout_id: str, max_wait: float) -> Rollout:
    deadline = time.monotonic() + max_wait
    while True:
        with session_scope(db_url) as s:
            r = s.get(Rollout, rollout_id)
            if r.status in TERMINAL_VALUES:
                return r
        if time.monotonic() > deadline:
            raise StageTimeout(f"rollout {rollout_id} did not finish in {max_wait}s")
        time.sleep(0.2)


def prorl_result(r: Rollout, turns: list[Turn] | None = None) -> dict[str, Any]:
    """A finished rollout in ProRL's response shape."""
    extra = r.extra or {}
    outcome = r.outcome or ""
    critical = None
    if outcome == "timeout":
        critical = "timeout"
    elif outcome == "infra_error":
        critical = (r.error or "run:").split(":", 1)[0] or "run"
    return {
        "instance_id": r.instance_id, "trajectory_id": r.id,
        "messages": prorl_messages(r.messages or [], r.prompt_ids or [], turns or []),
        "tools": extra.get("tools", []),
        "success": r.status == "done", "error": r.error, "finish": r.finish_reason,
        "end_properly": outcome == "completed", "resolved": bool(r.reward and r.reward >= 1.0),
        "reward": r.reward, "critical_error": critical,
        "filter": outcome in ("infra_error", "cancelled"), "git_patch": extra.get("git_patch"),
        "timing": {"init_time": r.init_seconds, "run_time": r.run_seconds,
                   "eval_time": r.eval_seconds},
        "prompt_ids": r.prompt_ids, "response_ids": r.response_ids,
        "response_logprobs": r.response_logprobs, "loss_mask": r.loss_mask,
        "outcome": outcome,
    }


def prorl_messages(messages: list[dict[str, Any]], prompt_ids: list[int],
                   turns: list[Turn]) -> list[dict[str, Any]]:
    """Messages as {role, content}; the k-th assistant message also carries turn k's generated
    ids (`token_ids`), the exact prompt of that call (`input_ids`), `logprobs` and its tool
    calls flattened to {name, arguments}: the shape NeMo Gym's ProRL adapter reads."""
    out, context, k = [], list(prompt_ids), 0
    for m in messages:
        item = {"role": m.get("role"), "content": m.get("content")}
        if m.get("role") == "assistant" and k < len(turns):
            turn = turns[k]
            item.update(token_ids=turn.generated_ids or [], input_ids=list(context),
                        logprobs=turn.logprobs or [],
                        tool_calls=[{"name": c.get("name"), "arguments": c.get("arguments")}
                                    for c in (turn.tool_calls or [])])
            context += (turn.generated_ids or []) + (turn.observation_ids or [])
            k += 1
        out.append(item)
    return out


@typed_route(bp, "/cancel", "POST", body=CancelRequest, summary="Cancel a ProRL job_id",
             tag="prorl")
def cancel(body: CancelRequest) -> dict[str, Any]:
    settings = current_app.config["RAAS"]
    with session_scope(settings.db_url) as s:
        ids = s.scalars(select(Job.id).where(
            Job.config["prorl_job_id"].as_string() == body.job_id)).all()
    for job_id in ids:
        cancel_job(settings, job_id)
    return {"job_id": body.job_id, "cancelled_jobs": len(ids)}


@typed_route(bp, "/status", "GET", summary="Service status, ProRL style", tag="prorl")
def status() -> dict[str, Any]:
    with session_scope(current_app.config["RAAS"].db_url) as s:
        servers = [{"address": u, "healthy": h, "in_flight": n} for u, h, n in
                   s.execute(select(LLMServer.url, LLMServer.healthy, LLMServer.in_flight))]
        active = s.scalar(select(Rollout.id).where(
            Rollout.status.not_in(TERMINAL_VALUES)).limit(1))
    return {"running": _flag().is_set(), "busy": active is not None, "llm_servers": servers}


@typed_route(bp, "/add_llm_server", "POST", body=AddServer, summary="Register a server",
             tag="prorl")
def add_llm_server(body: AddServer) -> dict[str, Any]:
    url = body.address if "://" in body.address else f"http://{body.address}"
    view = register_server(current_app.config["RAAS"].db_url, LLMServerCreate(url=url))
    return {"added": view.url}


@typed_route(bp, "/clear_llm_server", "POST", summary="Remove every server", tag="prorl")
def clear_llm_server() -> dict[str, Any]:
    return {"removed": clear_servers(current_app.config["RAAS"].db_url)}


@typed_route(bp, "/start", "POST", summary="Start accepting work (400 if running)", tag="prorl")
def start() -> dict[str, Any]:
    if _flag().is_set():
        raise InvalidRequest("already running")
    _flag().set()
    return {"running": True}


@typed_route(bp, "/stop", "POST", summary="Stop accepting /process", tag="prorl")
def stop() -> dict[str, Any]:
    _flag().clear()
    return {"running": False}
