"""The simulator's streamed `/v1/completions` answer (a fake of vLLM's, named as such).

vLLM with `stream: true` sends one SSE `data:` chunk per step, each a `text_completion` whose
choice carries that step's new `text`, its `token_ids` (with `return_token_ids`) and its
`logprobs` (`tokens`, `token_logprobs`, ... of those tokens only); the last token's chunk has
the `finish_reason` and `stop_reason`, the first one the `prompt_token_ids`; `data: [DONE]`
ends it (vllm/entrypoints/openai/completion/serving.py, `completion_stream_generator`). The
ids and logprobs, concatenated, are the non-streamed answer's; so is the text.

Here each token is one chunk, sent when its share of the reply's latency has passed (the
first after `latency / n`: a client measures a first-token time). The text of a chunk is what
decoding the ids so far adds to the text sent, never past the (stop-cut) text of the whole
reply, and nothing while the decoded text ends in an incomplete character (vLLM's
incremental detokenizer holds those back too).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from fakellm.script import Script


def stream_events(script: Script, body: dict[str, Any], result: dict[str, Any]) -> Iterator[str]:
    """The SSE events (`data: ...\\n\\n`) of one streamed answer, paced over its latency."""
    ids, logprobs, text = result["ids"], result["logprobs"], result["text"]
    head = {"id": "cmpl-sim", "object": "text_completion", "created": int(time.time()), "model": script.model}
    started, latency, sent = time.monotonic(), float(result.get("latency") or 0.0), 0
    count = max(1, len(ids))
    for i, token in enumerate(ids):
        last = i == len(ids) - 1
        wait = started + latency * (i + 1) / count - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        decoded = script.tok.decode(ids[: i + 1], skip_special_tokens=True)
        upto = len(text) if last else min(len(decoded), len(text))
        if not last and decoded.endswith("\ufffd"):
            upto = sent
        delta, sent = text[sent:upto], max(sent, upto)
        choice: dict[str, Any] = {
            "index": 0,
            "text": delta,
            "logprobs": {"tokens": [script.tok.id_to_token(token)], "token_logprobs": [logprobs[i]]},
            "finish_reason": result["finish_reason"] if last else None,
            "stop_reason": result["stop_reason"] if last else None,
            "token_ids": [token],
        }
        if i == 0:
            choice["prompt_token_ids"] = body["prompt"]
        yield f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"
    if not ids:  # nothing generated (max_tokens 0 is refused; a stop at once): one empty chunk
        choice = {"index": 0, "text": "", "logprobs": {"tokens": [], "token_logprobs": []}, "token_ids": []}
        choice |= {"finish_reason": result["finish_reason"], "stop_reason": result["stop_reason"]}
        yield f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n"
    yield "data: [DONE]\n\n"
