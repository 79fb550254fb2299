"""The job page's health strip: one tile per figure, each a sparkline over completed rollouts.

Pure functions over a `HealthView` (`app.job_health`), so the tiles can be tested without a
browser; the template only draws the polyline points and the threshold line computed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raas_client.health_models import HealthView

from agents.health_config import HealthConfig
from tasks.watch.health_alerts import RULES

W, H = 170, 40
# (figure, title, alert it feeds or None, format)
TILES = (
    ("turns_mean", "turns per rollout", "turns_collapse", "{:.2f}"),
    ("parse_failure_rate", "tool-call parse failures", "parse_failures", "{:.0%}"),
    ("reward_without_tools", "reward without tool calls", "reward_without_tools", "{:.0%}"),
    ("truncation_rate", "cut at the token limit", "truncation", "{:.0%}"),
    ("infra_rate", "infra failures", "infra", "{:.0%}"),
    ("reward_mean", "mean reward", None, "{:.3f}"),
)


@dataclass
class Tile:
    """One sparkline tile: the recent value, its threshold, and the line's SVG points."""

    figure: str
    title: str
    value: str
    threshold: str | None
    points: str
    threshold_y: float | None
    alerting: bool
    n_points: int


def _scale(values: list[float], threshold: float | None) -> tuple[float, float]:
    hi = max([*values, threshold or 0.0, 1e-9])
    return 0.0, hi * 1.1 if hi > 1 else 1.0


def tile(view: HealthView, config: HealthConfig, figure: str, title: str, alert: str | None, fmt: str) -> Tile:
    """The tile of `figure`: its series as points, the job's threshold as a line."""
    values = [v for v in view.series.get(figure, []) if v is not None]
    threshold = getattr(config, RULES[alert][1]) if alert else None
    lo, hi = _scale(values, threshold)

    def y(v: float) -> float:
        return round(H - 2 - (v - lo) / (hi - lo) * (H - 4), 1)

    step = W / max(1, len(values) - 1)
    points = " ".join(f"{round(i * step, 1)},{y(v)}" for i, v in enumerate(values))
    recent = getattr(view.recent, figure)
    active = {a.name for a in view.alerts if a.cleared_at is None}
    return Tile(
        figure=figure,
        title=title,
        value="–" if recent is None else fmt.format(recent),
        threshold=None if threshold is None else fmt.format(threshold),
        points=points,
        threshold_y=None if threshold is None else y(threshold),
        alerting=alert in active,
        n_points=len(values),
    )


def tiles(view: HealthView, config: HealthConfig) -> list[Tile]:
    """Every tile of the health strip."""
    return [tile(view, config, *spec) for spec in TILES]


def turns_bars(view: HealthView) -> dict[str, Any]:
    """The turns-per-rollout distribution as the `bars` macro draws it."""
    hist = view.overall.turns_hist
    counts = list(hist.values())
    return {"n": sum(counts), "counts": counts, "max_count": max(counts or [0]), "labels": list(hist)}


SPLIT = (
    ("gen", "generation", "wf-gen"),
    ("tool", "tools", "wf-tool"),
    ("harness", "harness work", "wf-tool"),
    ("waiting", "waiting on infrastructure", "wf-init"),
    ("paused", "paused pool", "wf-paused"),
    ("other", "other", "wf-other"),
)


def time_split(view: HealthView) -> list[dict[str, Any]]:
    """Mean seconds per rollout by whose time it was (generation, tools or harness, waiting,
    paused, other), with their shares."""
    ts = view.overall.time_split
    parts = [(k, label, css, ts[k]) for k, label, css in SPLIT if ts.get(k)]
    total = sum(p[3] for p in parts)
    return [{"key": k, "label": label, "css": css, "seconds": v, "pct": v / total * 100} for k, label, css, v in parts]
