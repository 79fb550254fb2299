"""Submission-time check that each instance's prompt fits the context (issue 12).

A prompt that leaves no room for one generated token can never become a sample. When the
handler can say what its prompt is before INIT (`AgentHandler.prompt`) and the context is
known (the job's `llm.max_model_len`, lowered to what the servers report in GET /v1/models),
the submission is rejected with the instance named; otherwise the rollout ends at RUN with
the `prompt_too_long` outcome. Only prompts whose rendered text has at least as many
characters as the context are tokenized (every token covers at least one character), so a
large batch of ordinary prompts costs one template render each.
"""

from __future__ import annotations

from typing import Any

from agents.abstract import AgentHandler, HandlerConfig
from agents.llm.spec import LLMSpec
from agents.llm.tokenizer import load_chat_tokenizer, server_max_model_len
from agents.tools import Tool, describe_tools
from core.errors import InvalidRequest


def effective_context(llm: LLMSpec, urls: list[str]) -> tuple[int, str]:
    """The largest context any of `urls` could give the job, and how it was derived."""
    served = [n for n in (server_max_model_len(url) for url in urls) if n is not None]
    job = llm.max_model_len
    if served and len(served) == len(urls) and max(served) < job:
        return max(served), f"llm.max_model_len {job}, servers serve at most {max(served)}"
    return job, f"llm.max_model_len {job}"


def check_prompts_fit(
    handler: AgentHandler,
    config: HandlerConfig,
    instances: list[tuple[str, dict[str, Any]]],
    llm: LLMSpec,
    urls: list[str],
) -> None:
    """Raise InvalidRequest naming the first instance whose prompt cannot fit the context
    (`llm` as the submission resolved it: its tokenizer and template text are set)."""
    if not instances or handler.prompt(instances[0][1], config) is None:
        return
    # The tokenizer's own template, as before: a job's inline template is rendered in the
    # gateway only inside the bounded child of `check_untrusted_template`.
    tok = load_chat_tokenizer(llm.tokenizer)
    limit, why = effective_context(llm, urls)
    for index, (instance_id, data) in enumerate(instances):
        system, user, tools = handler.prompt(data, config)
        schemas = [tool.schema() for tool in tools]
        text = tok.render(
            prompt_messages(system, user, tools, tok.supports_tools),
            schemas,
            True,
            **llm.chat_template_kwargs,
        )
        if len(text) < limit:
            continue
        n = len(tok.encode(text))
        if n >= limit:
            raise InvalidRequest(
                f"instances[{index}] ({instance_id}): the prompt is {n} tokens and leaves no "
                f"room to generate in a context of {limit} tokens ({why})",
                field=f"instances[{index}]",
            )


def prompt_messages(
    system_prompt: str, user_prompt: str, tools: list[Tool], template_renders_tools: bool
) -> list[dict[str, Any]]:
    """System + user messages; the tool list goes in the system prompt if the template can't
    (the loop's first prompt, and what a submission's fit check renders)."""
    if tools and not template_renders_tools:
        system_prompt = f"{system_prompt.rstrip()}\n\n{describe_tools(tools)}"
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": user_prompt}]
