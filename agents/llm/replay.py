"""Rebuild a rollout's LLM session from its stored turns, token for token (a resumed RUN).

Generated ids, logprobs, finish reasons and weight versions are appended verbatim, as they
were sampled. The messages appended after each generation are rendered again as the template
delta and must give the stored ids: any difference (another tokenizer, template or context
length) raises ResumeError, and the pipeline restarts the rollout from INIT rather than
continue a trajectory the policy never saw. The prompt is checked the same way, by digest.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from core.errors import ResumeError

if TYPE_CHECKING:
    from agents.llm.session import LLMSession


def prompt_digest(prompt_ids: list[int]) -> str:
    """A short digest of the prompt's ids (stored with every turn, compared on resume)."""
    return hashlib.sha256(",".join(map(str, prompt_ids)).encode()).hexdigest()[:16]


def replay_turns(session: LLMSession, turns: list[dict[str, Any]], digest: str | None) -> None:
    """Append `turns` (index order, from 0) to a session that was just `start`ed."""
    if digest is not None and prompt_digest(session.trajectory().prompt_ids) != digest:
        raise ResumeError("the prompt renders to other tokens than when the turns were logged")
    indexes = [turn["index"] for turn in turns]
    if indexes != list(range(len(turns))):
        raise ResumeError(f"stored turn indexes {indexes} are not 0..{len(turns) - 1}")
    builder = session.builder
    for turn in turns:
        extra = turn.get("extra") or {}
        if extra.get("context_length"):  # the server's limit, learnt before this generation
            builder.limit_context(int(extra["context_length"]))
        ids = list(turn.get("generated_ids") or [])
        logprobs = turn.get("logprobs")
        builder.add_generation(
            ids, logprobs if logprobs or not ids else None, turn.get("finish_reason"), turn.get("weight_version")
        )
        session.note_logprobs_mode(extra.get("logprobs_mode"))
        messages = turn.get("observation_messages")
        stored = list(turn.get("observation_ids") or [])
        if messages is None and (stored or turn.get("observation")):
            raise ResumeError(f"turn {turn['index']} was logged without its messages")
        if messages and builder.add_messages(messages) != stored:
            raise ResumeError(f"turn {turn['index']}: the observation renders to other tokens")
