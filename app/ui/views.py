"""The dashboard's pages: every query goes through `g.owner`, the same scoping as the API."""

from __future__ import annotations

from typing import Any

from flask import current_app, g, redirect, render_template, request, url_for

from app.context import gateway_settings
from app.jobs import cancel_job, get_job, job_view, owner_jobs, pause_job, resume_job
from app.metrics import llm_servers, queue_consumers, rollout_counts
from app.harness_figures import job_harness_figures
from app.recovery_costs import job_cost, rollout_cost
from app.rollouts import current_turns, job_rollout_rows, owned_rollout, rollout_turns
from agents.job_config import JobConfig
from app.job_health import app_cache, health_view
from app.ui import charts, health_charts, tokens
from app.ui.auth import bp, check_csrf, safe_next
from core.db import session_scope
from core.errors import InvalidRequest
from core.models import Rollout, Turn
from tasks.broker.config import UNROUTED_QUEUE
from tasks.watch.health_alerts import check_job
from tasks.broker.queues import known_queues, queue_depths

ROW_COLUMNS = (
    "id",
    "instance_id",
    "sample_index",
    "status",
    "outcome",
    "reward",
    "attempt",
    "node",
    "error",
    "init_seconds",
    "run_seconds",
    "eval_seconds",
    "created_at",
    "finished_at",
    "finish_reason",
)
MAX_GROUPS = 200  # instances listed on a job page; the charts cover every rollout
JOBS_PAGE = 50
# What the grader graded (swe: the patch; code: solution files; math/search: the answer) and
# what was kept from it (swe drops test files): shown above the rest of `extra`.
ARTIFACT_KEYS = (
    "git_patch",
    "patch",
    "files",
    "answer",
    "predicted_answer",
    "reference_answer",
    "artifact",
    "dropped_files",
    "dropped_reasons",
)


@bp.get("/")
def jobs():
    """The owner's jobs, newest first; the rows refresh themselves while any job runs."""
    with session_scope(gateway_settings().db_url) as s:
        views = owner_jobs(s, g.owner, request.args.get("before"), JOBS_PAGE)
    running = any(v.status in ("running", "paused", "cancelling") for v in views)
    template = "ui/_job_rows.html" if request.args.get("fragment") else "ui/jobs.html"
    return render_template(
        template, jobs=views, running=running, next_cursor=views[-1].job_id if len(views) == JOBS_PAGE else None
    )


@bp.post("/jobs/<job_id>/cancel")
def cancel(job_id: str):
    """Cancel a job (the page asked for confirmation first)."""
    check_csrf()
    cancel_job(gateway_settings(), job_id, g.owner, current_app.extensions["celery"])
    back = request.form.get("back")
    return redirect(safe_next(back) if back else url_for("ui.job", job_id=job_id), code=303)


@bp.post("/jobs/<job_id>/pause")
def pause(job_id: str):
    """Pause a job: its queued rollouts wait until it resumes."""
    check_csrf()
    pause_job(gateway_settings(), job_id, g.owner, current_app.extensions["celery"])
    return redirect(url_for("ui.job", job_id=job_id), code=303)


@bp.post("/jobs/<job_id>/resume")
def resume(job_id: str):
    """Resume a paused job."""
    check_csrf()
    resume_job(gateway_settings(), job_id, g.owner, current_app.extensions["celery"])
    return redirect(url_for("ui.job", job_id=job_id), code=303)


@bp.get("/jobs/<job_id>")
def job(job_id: str):
    """A job: GRPO groups, outcomes, stage timings, throughput, the slowest and the failed."""
    with session_scope(gateway_settings().db_url) as s:
        get_job(s, job_id, g.owner)
    check_job(gateway_settings().db_url, job_id, app_cache())  # alerts judged on read, as the API does
    with session_scope(gateway_settings().db_url) as s:
        j = get_job(s, job_id, g.owner)
        view = job_view(s, j)
        rows = job_rollout_rows(s, job_id, ROW_COLUMNS)
        config = j.config or {}
        health = health_view(s, j, app_cache())
        recovery = job_cost(s, job_id)
        harness = job_harness_figures(s, job_id) if j.agent == "harness" else None
    groups = charts.groups(rows)
    health_config = JobConfig.load(config).health
    return render_template(
        "ui/job.html",
        job=view,
        config=config,
        groups=groups[:MAX_GROUPS],
        n_groups=len(groups),
        reward_range=charts.reward_range(rows),
        histograms=charts.stage_histograms(rows),
        throughput=charts.throughput(rows, view.created_at),
        slowest=charts.slowest(rows),
        failed=charts.failed(rows),
        total_seconds=charts.total_seconds,
        health=health,
        health_tiles=health_charts.tiles(health, health_config),
        turns_bars=health_charts.turns_bars(health),
        time_split=health_charts.time_split(health),
        recovery=recovery,
        harness=harness,
    )


@bp.get("/rollouts/<rollout_id>")
def rollout(rollout_id: str):
    """A rollout: header, timing waterfall, the conversation with a lazy token view per turn."""
    with session_scope(gateway_settings().db_url) as s:
        r, job = owned_rollout(s, rollout_id, g.owner)
        turns, earlier = current_turns(s, r)
        recovery = rollout_cost(r.attempt, rollout_turns(s, r.id)) if earlier else None
        samples = tokens.samples_of(r)
        r, turns, sample = tokens.pick_sample(r, turns, request.args.get("sample"))
        segs = tokens.segments(r, turns)
        metrics = dict(r.metrics or {})
        extra = {k: v for k, v in (r.extra or {}).items() if k != "turn_boundaries"}
        return render_template(
            "ui/rollout.html",
            r=r,
            job=job,
            turns=turns,
            earlier_turns=earlier,
            recovery=recovery,
            segments=segs,
            metrics=metrics,
            waterfall=_waterfall(r, turns),
            prompt_messages=_prompt_messages(r.messages or []),
            n_tokens=len(r.prompt_ids or []) + len(r.response_ids or []),
            n_trained=sum(r.loss_mask or []),
            drift=_drift(metrics, segs),
            artifacts={k: extra[k] for k in ARTIFACT_KEYS if extra.get(k) not in (None, "", [], {})},
            other_extra={k: v for k, v in extra.items() if k not in ARTIFACT_KEYS and k != "samples"},
            tokenizer=tokens.tokenizer_path(job),
            samples=samples,
            sample=sample,
        )


@bp.get("/rollouts/<rollout_id>/tokens.json")
def rollout_tokens(rollout_id: str):
    """One segment's tokens (a turn being opened), or every segment (`segment=all`)."""
    raw = request.args.get("segment", "")
    with session_scope(gateway_settings().db_url) as s:
        r, job = owned_rollout(s, rollout_id, g.owner)
        r, turns, _ = tokens.pick_sample(r, current_turns(s, r)[0], request.args.get("sample"))
        segs = tokens.segments(r, turns)
        if raw == "all":
            return {"segments": [tokens.segment_rows(r, job, turns, sg) for sg in segs]}
        if not raw.isdigit() or int(raw) >= len(segs):
            raise InvalidRequest(f"segment must be 0..{len(segs) - 1} or all, got {raw!r}", field="segment")
        return tokens.segment_rows(r, job, turns, segs[int(raw)])


def _prompt_messages(messages: list[dict]) -> list[dict]:
    """The messages before the first assistant turn (system, user)."""
    out = []
    for m in messages:
        if m.get("role") == "assistant":
            break
        out.append(m)
    return out


def _waterfall(r: Rollout, turns: list[Turn]) -> dict[str, Any]:
    """Bars on one time axis: init, each turn's generation then tools, eval."""
    bars, t = [], 0.0
    if r.init_seconds is not None:
        bars.append({"label": "init", "kind": "init", "start": 0.0, "dur": r.init_seconds})
        t = r.init_seconds
    run_start = t
    for turn in turns:
        for kind, dur in (("gen", turn.gen_seconds), ("tool", turn.tool_seconds)):
            if dur:
                bars.append({"label": f"turn {turn.index} {kind}", "kind": kind, "start": t, "dur": dur})
                t += dur
    if r.run_seconds is not None:
        t = max(t, run_start + r.run_seconds)
    if r.eval_seconds is not None:
        bars.append({"label": "eval", "kind": "eval", "start": t, "dur": r.eval_seconds})
        t += r.eval_seconds
    return {"bars": bars, "total": t or 1.0, "run_start": run_start, "run": r.run_seconds}


def _drift(metrics: dict[str, Any], segs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The drift audit's divergences: the first of each affected turn, with its segment."""
    if not metrics.get("retokenization_drift") or metrics.get("first_diff") is None:
        return None
    per_turn = metrics.get("drift_turns") or [
        {"first_diff": metrics["first_diff"], "differing_tokens": metrics["retokenization_drift"]}
    ]
    marks = []
    for entry in per_turn:
        first = entry["first_diff"]
        seg = next((i for i, sg in enumerate(segs) if sg["start"] <= first < sg["end"]), None)
        marks.append(
            {
                "first": first,
                "count": entry.get("differing_tokens"),
                "segment": seg,
                "label": segs[seg]["label"] if seg is not None else "past the end",
            }
        )
    return {
        "count": metrics["retokenization_drift"],
        "first": metrics["first_diff"],
        "marks": marks,
        "positions": [m["first"] for m in marks],
    }


@bp.get("/stages")
def stages():
    """Live stage view: the numbers of /metrics (queues, consumers, rollouts, servers).

    Queues and rollout counts are the open /metrics numbers; servers are the caller's own
    (the operator's token sees every tenant's), as in GET /v1/llm-servers."""
    settings = gateway_settings()
    celery = current_app.extensions["celery"]
    queues = known_queues(settings.db_url)
    try:
        depths, consumers, broker_error = queue_depths(celery, queues), queue_consumers(celery), None
    except Exception as exc:  # noqa: BLE001 - the page still shows the database's numbers
        depths, consumers, broker_error = {}, {}, f"{exc.__class__.__name__}: {exc}"
    with session_scope(settings.db_url) as s:
        everyone = rollout_counts(s)
        mine = rollout_counts(s, g.owner)
        servers = [
            {
                "id": v.id,
                "owner": v.owner,
                "url": v.url,
                "model": v.model,
                "weight_version": v.weight_version,
                "healthy": v.healthy,
                "paused": v.paused,
                "in_flight": v.in_flight,
                "last_error": v.last_error,
            }
            for v in llm_servers(s, None if g.get("admin") else g.owner)
        ]
    template = "ui/_stages_body.html" if request.args.get("fragment") else "ui/stages.html"
    return render_template(
        template,
        table=_queue_table(queues, depths, consumers),
        everyone=_status_table(everyone),
        mine=_status_table(mine),
        servers=servers,
        broker_error=broker_error,
    )


def _queue_table(queues: list[str], depths: dict[str, int], consumers: dict[str, int]) -> list[dict[str, Any]]:
    """One row per queue: stage, node, waiting messages, consuming pools."""
    rows = []
    for q in sorted(set(queues) | set(consumers)):
        if q == "init":
            stage, node = "init", "any"
        elif q == UNROUTED_QUEUE:
            stage, node = "unrouted", "none"
        else:
            stage, _, node = q.partition(".")
        rows.append(
            {"queue": q, "stage": stage, "node": node, "depth": depths.get(q, 0), "consumers": consumers.get(q, 0)}
        )
    order = {"init": 0, "run": 1, "eval": 2}
    return sorted(rows, key=lambda row: (order.get(row["stage"], 3), row["node"]))


def _status_table(counts: list[tuple[str, str | None, int]]) -> dict[str, Any]:
    """{by_status: {status: n}, by_outcome: {outcome: n}}."""
    by_status: dict[str, int] = {}
    by_outcome: dict[str, int] = {}
    for status, outcome, n in counts:
        by_status[status] = by_status.get(status, 0) + n
        if outcome:
            by_outcome[outcome] = by_outcome.get(outcome, 0) + n
    return {"by_status": by_status, "by_outcome": by_outcome}
