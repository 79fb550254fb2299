"""The token view's data: a rollout cut into per-turn segments, each token as its text piece.

A segment is the prompt, or one turn's generated tokens plus the template delta that follows
them (observations, mask 0), so the page can fetch and draw one turn at a time. Pieces are
decoded one id at a time with the job's own tokenizer (special tokens kept), memoised per
tokenizer, so a 30k-token rollout costs one decode per distinct id, once per gateway process.
"""

from __future__ import annotations

import bisect
import logging
import threading
from typing import Any

from core.models import Job, Rollout, Turn

log = logging.getLogger(__name__)
_pieces: dict[str, dict[int, str]] = {}
_pieces_lock = threading.Lock()


class SampleView:
    """A rollout seen as one of its samples (a harness rollout split when its history was
    rewritten): the sample's arrays and turn boundaries, everything else the rollout's."""

    def __init__(self, rollout: Rollout, index: int) -> None:
        samples = (rollout.extra or {}).get("samples") or []
        sample = samples[index]
        self._rollout = rollout
        self.sample_index_of_rollout = index
        self.prompt_ids = sample.get("prompt_ids") or []
        self.response_ids = sample.get("response_ids") or []
        self.response_logprobs = sample.get("response_logprobs") or []
        self.loss_mask = sample.get("loss_mask") or []
        self.policy_versions = sample.get("policy_versions") or []
        self.finish_reason = sample.get("finish_reason")
        self.extra = {**(rollout.extra or {}), "turn_boundaries": sample.get("turn_boundaries")}
        last = index == len(samples) - 1
        self.messages = rollout.messages if last else []  # stored for the last sample only

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rollout, name)


def samples_of(r: Rollout) -> list[dict[str, Any]]:
    """[{index, calls, split_reason, tokens}] of a split rollout ([] for one sequence)."""
    return [
        {
            "index": k,
            "calls": s.get("calls"),
            "split_reason": s.get("split_reason"),
            "tokens": len(s.get("prompt_ids") or []) + len(s.get("response_ids") or []),
        }
        for k, s in enumerate((r.extra or {}).get("samples") or [])
    ]


def pick_sample(r: Rollout, turns: list[Turn], raw: str | None) -> tuple[Any, list[Turn], int | None]:
    """The rollout (or its sample `raw`, default the last) and that sample's turns."""
    count = len((r.extra or {}).get("samples") or [])
    if not count:
        return r, turns, None
    index = int(raw) if raw is not None and raw.isdigit() and int(raw) < count else count - 1
    mine = [t for t in turns if (t.extra or {}).get("sample") == index]
    return SampleView(r, index), mine, index


def segments(r: Rollout, turns: list[Turn]) -> list[dict[str, Any]]:
    """[{label, start, end, turn, live}] over prompt+response positions (end exclusive).

    A rollout still running has no token arrays yet (they are stored when RUN ends): its
    segments are then the turn log's (`live`), positions counted from the first response token.
    """
    n_prompt, n_resp = len(r.prompt_ids or []), len(r.response_ids or [])
    out = [{"label": "prompt", "start": 0, "end": n_prompt, "turn": None, "live": False}]
    if r.response_ids is None and turns:
        return out + _live_segments(turns)
    starts = _turn_starts(r, turns, n_resp)
    if starts is None:
        if n_resp:
            out.append({"label": "response", "start": n_prompt, "end": n_prompt + n_resp, "turn": None, "live": False})
        return out
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else n_resp
        out.append({"label": f"turn {k}", "start": n_prompt + start, "end": n_prompt + end, "turn": k, "live": False})
    return out


def _live_segments(turns: list[Turn]) -> list[dict[str, Any]]:
    """One segment per logged turn: its generated ids, then its observation delta."""
    out, pos = [], 0
    for k, t in enumerate(turns):
        n = len(t.generated_ids or []) + len(t.observation_ids or [])
        out.append({"label": f"turn {k}", "start": pos, "end": pos + n, "turn": k, "live": True})
        pos += n
    return out


def live_rows(turn: Turn, job: Job, start: int) -> dict[str, Any]:
    """A running rollout's turn from the turn log: generated (mask 1) then observation ids."""
    gen, obs = list(turn.generated_ids or []), list(turn.observation_ids or [])
    logprobs = list(turn.logprobs or [])
    logprobs = (logprobs + [None] * len(gen))[: len(gen)]
    ids = gen + obs
    return {
        "start": start,
        "end": start + len(ids),
        "ids": ids,
        "pieces": pieces(tokenizer_path(job), ids),
        "mask": [1] * len(gen) + [0] * len(obs),
        "logprobs": logprobs + [0.0] * len(obs),
        "versions": [turn.weight_version] * len(gen) + [None] * len(obs),
    }


def segment_rows(r: Rollout, job: Job, turns: list[Turn], seg: dict[str, Any]) -> dict[str, Any]:
    """The tokens of one segment, from the stored arrays or (live) from the turn log."""
    if seg["live"]:
        return {**seg, **live_rows(turns[seg["turn"]], job, seg["start"])}
    return {**seg, **token_rows(r, job, seg["start"], seg["end"])}


def _turn_starts(r: Rollout, turns: list[Turn], n_resp: int) -> list[int] | None:
    """Where each turn's generation starts in response_ids: the stored boundaries, else the
    turn log's lengths; None when neither fits the arrays."""
    bounds = (r.extra or {}).get("turn_boundaries")
    if bounds and all(0 <= b[0] <= b[1] <= n_resp for b in bounds):
        return [b[0] for b in bounds]
    starts, pos = [], 0
    for t in turns:
        starts.append(pos)
        pos += len(t.generated_ids or []) + len(t.observation_ids or [])
    return starts if turns and pos == n_resp else None


def token_rows(r: Rollout, job: Job, start: int, end: int) -> dict[str, Any]:
    """Tokens [start, end) of prompt+response: ids, pieces, mask, logprobs, policy version."""
    prompt, resp = r.prompt_ids or [], r.response_ids or []
    ids = (prompt + resp)[start:end]
    n_prompt = len(prompt)
    mask, logprobs, versions = [], [], []
    version_of = _version_lookup(r)
    for pos in range(start, start + len(ids)):
        k = pos - n_prompt
        in_resp = k >= 0
        mask.append((r.loss_mask or [])[k] if in_resp and k < len(r.loss_mask or []) else 0)
        logprobs.append((r.response_logprobs or [])[k] if in_resp and k < len(r.response_logprobs or []) else None)
        versions.append(version_of(k) if in_resp else None)
    return {
        "start": start,
        "end": start + len(ids),
        "ids": ids,
        "pieces": pieces(tokenizer_path(job), ids),
        "mask": mask,
        "logprobs": logprobs,
        "versions": versions,
    }


def _version_lookup(r: Rollout):
    """Response position -> the policy (weight) version of the turn that generated it."""
    bounds = (r.extra or {}).get("turn_boundaries") or []
    versions = r.policy_versions or []

    starts = [b[0] for b in bounds]

    def version_of(k: int) -> Any:
        i = bisect.bisect_right(starts, k) - 1
        if 0 <= i < len(versions) and k < bounds[i][1]:
            return versions[i]
        return None  # template delta tokens: not generated by any policy

    return version_of


def tokenizer_path(job: Job) -> str | None:
    """The tokenizer folder the job's trajectories were built with (resolved at submission)."""
    from agents.job_config import JobConfig

    try:
        llm = JobConfig.load(job.config).llm
    except ValueError:  # a row older than the typed config: the page falls back to ids
        return None
    return llm.tokenizer if llm is not None else None


def pieces(path: str | None, ids: list[int]) -> list[str] | None:
    """Each id's literal text with the tokenizer at `path`; None when it cannot be loaded."""
    if not path:
        return None
    try:
        from agents.llm.tokenizer import load_chat_tokenizer

        tok = load_chat_tokenizer(path)
    except Exception as exc:  # noqa: BLE001 - the folder moved or is gone: the view falls back to ids
        log.warning("token view: cannot load tokenizer %s: %s", path, exc)
        return None
    with _pieces_lock:
        cache = _pieces.setdefault(path, {})
        missing = sorted({i for i in ids if i not in cache})
        if missing:
            texts = tok.hf.batch_decode([[i] for i in missing], skip_special_tokens=False)
            cache.update(zip(missing, texts))
        return [cache[i] for i in ids]
