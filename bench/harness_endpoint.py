"""Harness endpoint latency: what a chat completion through a rollout's endpoint adds over
sending the same generation straight to the inference server.

The server is the LLM simulator (a fake vLLM, named as such) in its own process with zero
latency, serving the real SmolLM2 tokenizer; the job's template is the Qwen-style tool
template of the tests. A harness-like client holds a conversation of `--calls` calls (each
extends the previous one: the merge path; the first is a full render) with one tool, over
the endpoint's Unix socket. Right after each call, the baseline sends the very prompt ids
that call sent (read back from the trajectory) straight to the server with the same backend
client the session uses (`agents.llm.backends`, vLLM's token-id API). Calls alternate, so
both see the same machine state. Two clients are measured through the endpoint: raw httpx
(what the endpoint costs) and the official openai SDK (what a typical harness pays in all;
the SDK's own parsing is not the endpoint's). Added latency: the p50 over calls of (endpoint
time - direct time of the same prompt, measured right after), in wall time and in this
process's CPU time (the client, the endpoint's threads and the session all run here; the
server runs elsewhere), which a loaded machine distorts less than wall time. A third path is
what a raas handler's own loop does for the same turn in process (`LLMSession`: the template
delta, then the generation): the endpoint minus that is what serving the API costs on top of
raas's token-exact rendering, and the two trajectories must be the same ids.

Time to first token with streaming (`--ttft-conversations`, a server with `--ttft-latency`
seconds per reply spread over its tokens, the reply's text before its tool call): per call, the
time from sending a `stream: true` request to the endpoint to its first content chunk, against
the time from sending the same prompt ids straight to the server with `stream: true` (the
session's backend client) to its first text: the server's own TTFT. Paired per call.

Usage: .venv/bin/python bench/harness_endpoint.py [--conversations 20] [--calls 8] [--ttft-conversations 6]
Prints one JSON object, then a table.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SMOLLM2 = str(REPO / "tests" / "fixtures" / "smollm2-tokenizer")
TEMPLATE = REPO / "tests" / "fixtures" / "qwen-style-template" / "chat_template.jinja"
REPLY = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls -la src"}}\n</tool_call>'
TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    },
}
OBSERVATION = "total 8\n-rw-r--r-- 1 agent agent 120 main.py\n-rw-r--r-- 1 agent agent 80 util.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


STREAMED_REPLY = "Let me look at the source tree first, then the failing test.\n" + REPLY


def start_server(tmp: Path, reply: str = REPLY, latency: float = 0.0) -> tuple[str, Any]:
    from fakellm.server import start_simulator_process

    script = tmp / f"script-{latency}.json"
    script.write_text(json.dumps({"default": [reply], "latency": latency, "model": "sim"}))
    return start_simulator_process(SMOLLM2, script, free_port())


def open_session(url: str, rollout_id: str) -> Any:
    """An LLM session on the server with the job's tokenizer and template."""
    from agents.llm import LLMSession

    spec = {
        "servers": [{"url": url, "model": "sim"}],
        "tokenizer": SMOLLM2,
        "max_model_len": 8192,
        "chat_template_text": TEMPLATE.read_text(),
    }
    return LLMSession.open(spec, {"max_tokens": 128}, rollout_id)


def open_endpoint(url: str, tmp: Path, k: int) -> Any:
    """A fresh rollout: session, RUN context, entered endpoint."""
    from agents.abstract import HandlerConfig
    from agents.harness import RolloutEndpoint
    from agents.job_config import JobConfig
    from bench.support.run_context import run_context

    session = open_session(url, f"bench-{k}")
    ctx = run_context(
        rollout_id=f"bench-{k}",
        job_id="bench",
        instance_id="i",
        instance={},
        sample_index=0,
        attempt=1,
        agent_config=HandlerConfig(),
        job_config=JobConfig(),
        deadline=time.monotonic() + 3600,
        state={},
        llm=session,
    )
    ep = RolloutEndpoint(ctx, str(tmp / f"ep{k}.sock"), RolloutEndpoint.new_token())
    return ep.__enter__()


def direct_call(backend: Any, url: str, prompt_ids: list[int]) -> tuple[float, float]:
    """The same generation sent straight to the server: (wall, this process's CPU) seconds."""
    from agents.llm.backends import GenerateRequest

    started, cpu = time.perf_counter(), time.process_time()
    backend.generate(
        url,
        GenerateRequest(prompt_ids=prompt_ids, max_tokens=128, sampling={"temperature": 1.0}, timeout=30, model="sim"),
    )
    return time.perf_counter() - started, time.process_time() - cpu


def loop_turn(session: Any, n: int, messages: list[dict[str, Any]]) -> tuple[float, float]:
    """What a raas handler's loop does for the same turn (render the new messages as the
    template delta, generate through the session): (wall, CPU) seconds."""
    started, cpu = time.perf_counter(), time.process_time()
    if n == 0:
        session.start(messages, [TOOL])
    else:
        session.append_messages([{"role": "tool", "content": OBSERVATION}])
    session.generate(time.monotonic() + 60)
    return time.perf_counter() - started, time.process_time() - cpu


def conversation(ep: Any, client_kind: str, backend: Any, url: str, calls: int, out: dict[str, list[float]]) -> None:
    """One harness conversation; per call: the endpoint's time, the direct time and the
    loop's time for the same turn."""
    import httpx

    loop = open_session(url, f"loop-{ep.ctx.rollout_id}")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful software engineer."},
        {"role": "user", "content": "Fix the failing test in src/. Start by looking around."},
    ]
    http = httpx.Client(transport=httpx.HTTPTransport(uds=ep.socket_path), timeout=30)
    sdk = None
    if client_kind == "openai":
        import openai

        sdk = openai.OpenAI(base_url="http://rollout/v1", api_key=ep.token, http_client=http, max_retries=0)
    for n in range(calls):
        started, cpu = time.perf_counter(), time.process_time()
        if sdk is not None:
            reply = sdk.chat.completions.create(model="p", messages=messages, tools=[TOOL])
            message = reply.choices[0].message.model_dump(exclude_none=True)
        else:
            body = http.post(
                "http://rollout/v1/chat/completions",
                headers={"Authorization": f"Bearer {ep.token}"},
                json={"model": "p", "messages": messages, "tools": [TOOL]},
            ).json()
            message = body["choices"][0]["message"]
        took, took_cpu = time.perf_counter() - started, time.process_time() - cpu
        kind = "first" if n == 0 else "merged"
        traj = ep.runner.tracker.current.trajectory
        start = traj.turn_boundaries[-1][0]
        direct, direct_cpu = direct_call(backend, url, traj.prompt_ids + traj.response_ids[:start])
        out[f"{client_kind}:{kind}"].append(took)
        out[f"direct:{kind}"].append(direct)
        out[f"added:{client_kind}"].append(took - direct)  # paired: same moment, same prompt
        out[f"added_cpu:{client_kind}"].append(took_cpu - direct_cpu)
        loop_wall, loop_cpu = loop_turn(loop, n, messages[:2])
        out[f"loop:{kind}"].append(loop_wall)
        out[f"added_vs_loop:{client_kind}"].append(took - loop_wall)
        out[f"added_cpu_vs_loop:{client_kind}"].append(took_cpu - loop_cpu)
        messages += [message] + [
            {"role": "tool", "tool_call_id": c["id"], "content": OBSERVATION} for c in message["tool_calls"]
        ]
    http.close()
    same = loop.trajectory().response_ids == traj.response_ids and loop.trajectory().prompt_ids == traj.prompt_ids
    out["same_ids_as_loop"].append(float(same))
    loop.close()


def direct_ttft(backend: Any, url: str, prompt_ids: list[int]) -> float:
    """Seconds from sending the prompt straight to the server (`stream: true`) to its first text."""
    from agents.llm.backends import GenerateRequest

    first: list[float] = []
    started = time.perf_counter()
    request = GenerateRequest(
        prompt_ids=prompt_ids, max_tokens=128, sampling={"temperature": 1.0}, timeout=30, model="sim"
    )
    request.on_delta = lambda text: first or first.append(time.perf_counter())
    backend.generate(url, request)
    return first[0] - started


def streamed_call(http: Any, token: str, messages: list[dict[str, Any]]) -> tuple[float, dict[str, Any]]:
    """(seconds to the first content chunk, the assistant message) of one streamed call."""
    started, first = time.perf_counter(), None
    content, calls = "", {}
    body = {"model": "p", "messages": messages, "tools": [TOOL], "stream": True}
    headers = {"Authorization": f"Bearer {token}"}
    with http.stream("POST", "http://rollout/v1/chat/completions", headers=headers, json=body) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"]
            if delta.get("content"):
                first = first or time.perf_counter()
                content += delta["content"]
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
                slot["id"] = tc.get("id") or slot["id"]
                slot["name"] = tc.get("function", {}).get("name") or slot["name"]
                slot["arguments"] += tc.get("function", {}).get("arguments") or ""
    tool_calls = [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
        for c in calls.values()
    ]
    return (first or time.perf_counter()) - started, {"role": "assistant", "content": content, "tool_calls": tool_calls}


def ttft_conversation(ep: Any, backend: Any, url: str, calls: int, out: dict[str, list[float]]) -> None:
    """One streamed conversation: per call, the endpoint's TTFT and the server's own for the
    same prompt ids, measured right after."""
    import httpx

    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful software engineer."},
        {"role": "user", "content": "Fix the failing test in src/. Start by looking around."},
    ]
    http = httpx.Client(transport=httpx.HTTPTransport(uds=ep.socket_path), timeout=30)
    for _ in range(calls):
        ttft, message = streamed_call(http, ep.token, messages)
        traj = ep.runner.tracker.current.trajectory
        start = traj.turn_boundaries[-1][0]
        server = direct_ttft(backend, url, traj.prompt_ids + traj.response_ids[:start])
        out["ttft:endpoint"].append(ttft)
        out["ttft:server"].append(server)
        out["ttft_added"].append(ttft - server)
        messages += [message] + [
            {"role": "tool", "tool_call_id": c["id"], "content": OBSERVATION} for c in message["tool_calls"]
        ]
    http.close()


def summary(values: list[float]) -> dict[str, float]:
    ms = sorted(v * 1000 for v in values)
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 3),
        "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 3),
        "mean_ms": round(statistics.fmean(ms), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--ttft-conversations", type=int, default=6)
    parser.add_argument("--ttft-latency", type=float, default=0.3, help="seconds per streamed reply")
    args = parser.parse_args()
    from collections import defaultdict

    from agents.llm.backends import get_backend_class

    tmp = Path(tempfile.mkdtemp(prefix="raas-bench-ep-", dir="/tmp"))
    url, stop = start_server(tmp)
    backend = get_backend_class("vllm")()
    out: dict[str, list[float]] = defaultdict(list)
    try:
        warm = defaultdict(list)
        for k, kind in enumerate(["httpx", "openai"]):  # warm-up: imports, caches
            ep = open_endpoint(url, tmp, 1000 + k)
            conversation(ep, kind, backend, url, 3, warm)
            ep.__exit__(None, None, None)
        for k in range(args.conversations):
            kind = "httpx" if k % 2 == 0 else "openai"
            ep = open_endpoint(url, tmp, k)
            conversation(ep, kind, backend, url, args.calls, out)
            ep.__exit__(None, None, None)
    finally:
        stop()
    url, stop = start_server(tmp, STREAMED_REPLY, args.ttft_latency)
    try:
        for k in range(args.ttft_conversations + 1):  # the first: warm-up
            ep = open_endpoint(url, tmp, 2000 + k)
            ttft_conversation(ep, backend, url, args.calls, out if k else defaultdict(list))
            ep.__exit__(None, None, None)
    finally:
        stop()
    report(out, args)


def report(out: dict[str, list[float]], args: argparse.Namespace) -> None:
    rows = {key: summary(values) for key, values in sorted(out.items()) if key != "same_ids_as_loop"}
    direct_all = out["direct:first"] + out["direct:merged"]
    figures: dict[str, Any] = {
        "conversations": args.conversations,
        "calls": args.calls,
        "latency": rows,
        "direct": summary(direct_all),
    }
    for kind in ("httpx", "openai"):
        figures[f"added_p50_ms_{kind}"] = rows[f"added:{kind}"]["p50_ms"]
        figures[f"added_cpu_p50_ms_{kind}"] = rows[f"added_cpu:{kind}"]["p50_ms"]
        figures[f"added_vs_loop_p50_ms_{kind}"] = rows[f"added_vs_loop:{kind}"]["p50_ms"]
        figures[f"added_cpu_vs_loop_p50_ms_{kind}"] = rows[f"added_cpu_vs_loop:{kind}"]["p50_ms"]
    figures["same_ids_as_loop"] = all(out["same_ids_as_loop"])
    figures["goal_added_p50_ms"] = 1.0
    if out["ttft_added"]:
        figures["ttft_p50_ms_endpoint"] = rows["ttft:endpoint"]["p50_ms"]
        figures["ttft_p50_ms_server"] = rows["ttft:server"]["p50_ms"]
        figures["ttft_added_p50_ms"] = rows["ttft_added"]["p50_ms"]
        figures["goal_ttft_added_p50_ms"] = 2.0
    figures["loadavg_1min"] = float(Path("/proc/loadavg").read_text().split()[0])
    print(json.dumps(figures))
    print(f"\n{'path':<26} {'n':>5} {'p50 ms':>9} {'p90 ms':>9} {'mean ms':>9}")
    for key, row in rows.items():
        print(f"{key:<26} {row['n']:>5} {row['p50_ms']:>9.3f} {row['p90_ms']:>9.3f} {row['mean_ms']:>9.3f}")
    print(
        f"\nadded p50 (endpoint - direct, paired per call): httpx "
        f"{figures['added_p50_ms_httpx']} ms wall / {figures['added_cpu_p50_ms_httpx']} ms "
        f"CPU; openai SDK {figures['added_p50_ms_openai']} ms wall / "
        f"{figures['added_cpu_p50_ms_openai']} ms CPU (goal <= 1 ms; load average "
        f"{figures['loadavg_1min']} on {os.cpu_count()} CPUs)"
    )
    print(
        f"over a raas handler's loop doing the same turn (p50, paired): httpx "
        f"{figures['added_vs_loop_p50_ms_httpx']} ms wall / "
        f"{figures['added_cpu_vs_loop_p50_ms_httpx']} ms CPU, openai SDK "
        f"{figures['added_vs_loop_p50_ms_openai']} ms wall / "
        f"{figures['added_cpu_vs_loop_p50_ms_openai']} ms CPU; same token ids as the loop: "
        f"{figures['same_ids_as_loop']}"
    )
    if out["ttft_added"]:
        print(
            f"time to first token, streamed (p50): endpoint {figures['ttft_p50_ms_endpoint']} ms, server's own "
            f"{figures['ttft_p50_ms_server']} ms, added {figures['ttft_added_p50_ms']} ms paired (goal <= 2 ms)"
        )


if __name__ == "__main__":
    main()
