"""Harness endpoint latency: what a chat completion through a rollout's endpoint adds over
sending the same generation straight to the inference server.

The server is the LLM simulator (a fake vLLM, named as such) in its own process with zero
latency, serving the real SmolLM2 tokenizer; the job's template is the Qwen-style tool
template of the tests. The endpoint runs in this process (as in a RUN worker). The harness runs
in a process of its own (as a real one does, in its sandbox): it holds a conversation of
`--calls` calls (each extends the previous one: the merge path; the first is a full render)
with one tool, over the endpoint's Unix socket, with its own client: raw httpx (what the
endpoint costs) or the official openai SDK (what a typical harness pays in all; the SDK's own
parsing is not the endpoint's).

Right after each call the same harness process sends the very prompt ids that call sent (read
back from the trajectory) straight to the server with httpx: a bare request, the same client
library on both sides of the comparison. Added latency: the p50 over calls of (endpoint time -
bare time of the same prompt, measured right after), in wall time and in CPU (the harness's
for both, plus this process's during the endpoint call: the endpoint's threads).

Two more comparisons, from this process: the same prompt through the session's own backend
client (`agents.llm.backends`, which skips httpx's request and response objects), and what a
raas handler's own loop does for the same turn in process (`LLMSession`: the template delta,
then the generation): the endpoint minus that is what serving the API costs on top of raas's
token-exact rendering, and the two trajectories must be the same ids.

Time to first token with streaming (`--ttft-conversations`, a server with `--ttft-latency`
seconds per reply spread over its tokens, the reply's text before its tool call): per call, the
time from the harness sending a `stream: true` request to the endpoint to its first content
chunk, against the same prompt ids sent by the same harness with `stream: true` straight to the
server to its first text. Paired per call. The simulator paces its first token with a sleep
whose overshoot moves one measurement by ±0.3-0.5 ms; it reports how long it took from handling
each streamed request to writing its first chunk (`/sim/stats`), and `ttft_added_net` takes
that out of both sides.

Until this round the harness ran in this process: its client and the endpoint then took turns
on one interpreter lock (~0.25 ms a call), and the baseline was the session's backend client.
`--in-process` is not kept; the tree before has that bench (BENCHMARKS.md compares both).

Usage: .venv/bin/python bench/harness_endpoint.py [--conversations 20] [--calls 8] [--ttft-conversations 6]
Prints one JSON object, then a table.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
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
    """A fresh rollout: session, RUN context, endpoint (served inside `with`)."""
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
    return RolloutEndpoint(ctx, str(tmp / f"ep{k}.sock"), RolloutEndpoint.new_token())


def direct_call(backend: Any, url: str, prompt_ids: list[int]) -> tuple[float, float]:
    """The same generation sent straight to the server: (wall, this process's CPU) seconds."""
    from agents.llm.backends import GenerateRequest

    started, cpu = time.perf_counter(), time.process_time()
    backend.generate(
        url,
        GenerateRequest(prompt_ids=prompt_ids, max_tokens=128, sampling={"temperature": 1.0}, timeout=30, model="sim"),
    )
    return time.perf_counter() - started, time.process_time() - cpu


def bare_body(prompt_ids: list[int], **extra: Any) -> dict[str, Any]:
    """The generation request as the session's vLLM backend sends it (token ids in)."""
    return {
        "model": "sim",
        "prompt": prompt_ids,
        "max_tokens": 128,
        "temperature": 1.0,
        "logprobs": 0,
        "return_token_ids": True,
        **extra,
    }


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


def direct_ttft(backend: Any, url: str, prompt_ids: list[int]) -> float:
    """Seconds from sending the prompt straight to the server (`stream: true`) through the
    session's backend client to its first text."""
    from agents.llm.backends import GenerateRequest

    first: list[float] = []
    started = time.perf_counter()
    request = GenerateRequest(
        prompt_ids=prompt_ids, max_tokens=128, sampling={"temperature": 1.0}, timeout=30, model="sim"
    )
    request.on_delta = lambda text: first or first.append(time.perf_counter())
    backend.generate(url, request)
    return first[0] - started


# -- the harness: its own process ----------------------------------------------------------
FIRST_MESSAGES = [
    {"role": "system", "content": "You are a careful software engineer."},
    {"role": "user", "content": "Fix the failing test in src/. Start by looking around."},
]


class HarnessSide:
    """The harness process's state: its clients and its conversation (`harness_main`)."""

    def __init__(self, kind: str, socket_path: str, token: str, server: str) -> None:
        import httpx

        self.kind, self.token, self.server = kind, token, server
        self.http = httpx.Client(transport=httpx.HTTPTransport(uds=socket_path), timeout=30)
        self.bare = httpx.Client(timeout=30)  # straight to the server
        self.sdk = None
        if kind == "openai":
            import openai

            self.sdk = openai.OpenAI(base_url="http://rollout/v1", api_key=token, http_client=self.http, max_retries=0)
        self.messages = [dict(m) for m in FIRST_MESSAGES]

    def close(self) -> None:
        self.http.close()
        self.bare.close()

    def call(self, stream: bool) -> dict[str, Any]:
        """One call through the endpoint: wall and CPU seconds (and, streamed, to the first text)."""
        started, cpu = time.perf_counter(), time.process_time()
        if stream:
            first, message = self._streamed(started)
        elif self.sdk is not None:
            reply = self.sdk.chat.completions.create(model="p", messages=self.messages, tools=[TOOL])
            first, message = None, reply.choices[0].message.model_dump(exclude_none=True)
        else:
            body = self.http.post(
                "http://rollout/v1/chat/completions",
                headers={"Authorization": f"Bearer {self.token}"},
                json={"model": "p", "messages": self.messages, "tools": [TOOL]},
            ).json()
            first, message = None, body["choices"][0]["message"]
        took, took_cpu = time.perf_counter() - started, time.process_time() - cpu
        self.messages += [message] + [
            {"role": "tool", "tool_call_id": c["id"], "content": OBSERVATION} for c in message["tool_calls"]
        ]
        return {"wall": took, "cpu": took_cpu, "ttft": first}

    def _streamed(self, started: float) -> tuple[float, dict[str, Any]]:
        """(seconds to the first content chunk, the assistant message) of one streamed call."""
        first, content, calls = None, "", {}
        body = {"model": "p", "messages": self.messages, "tools": [TOOL], "stream": True}
        headers = {"Authorization": f"Bearer {self.token}"}
        with self.http.stream("POST", "http://rollout/v1/chat/completions", headers=headers, json=body) as response:
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                delta = json.loads(line[6:])["choices"][0]["delta"]
                if delta.get("content"):
                    first = first or time.perf_counter() - started
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
        if first is None:
            raise AssertionError("the endpoint streamed no text")
        return first, {"role": "assistant", "content": content, "tool_calls": tool_calls}

    def bare_call(self, prompt_ids: list[int], stream: bool) -> dict[str, Any]:
        """The same generation sent straight to the server by this harness's httpx: wall and
        CPU seconds (streamed: and to the first text, the lines read as the endpoint's are)."""
        started, cpu, first = time.perf_counter(), time.process_time(), None
        url = f"{self.server}/v1/completions"
        if not stream:
            self.bare.post(url, json=bare_body(prompt_ids)).json()
        else:
            with self.bare.stream("POST", url, json=bare_body(prompt_ids, stream=True)) as response:
                for line in response.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    choices = json.loads(line[6:]).get("choices") or [{}]
                    if choices[0].get("text") and first is None:
                        first = time.perf_counter() - started
            if first is None:
                raise AssertionError("the server streamed no text")
        return {"wall": time.perf_counter() - started, "cpu": time.process_time() - cpu, "ttft": first}


def harness_main() -> None:
    """The harness process: JSON commands on stdin, one JSON answer per line on stdout."""
    side: HarnessSide | None = None
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        if op == "open":
            if side is not None:
                side.close()
            side = HarnessSide(command["kind"], command["socket"], command["token"], command["server"])
            answer: dict[str, Any] = {}
        elif op == "call":
            assert side is not None
            answer = side.call(command["stream"])
        elif op == "bare":
            assert side is not None
            answer = side.bare_call(command["ids"], command["stream"])
        else:
            return
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


class Harness:
    """The parent's handle on a harness process (`harness_main`)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--harness-process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def ask(self, **command: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the harness process ended (exit {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        try:
            self.ask(op="exit")
        except (RuntimeError, BrokenPipeError, json.JSONDecodeError):
            pass
        self.proc.wait(timeout=10)


def sent_ids(ep: Any) -> list[int]:
    """The prompt ids the endpoint's last call sent to the server."""
    traj = ep.runner.tracker.current.trajectory
    return traj.prompt_ids + traj.response_ids[: traj.turn_boundaries[-1][0]]


def conversation(
    harness: Harness, ep: Any, kind: str, backend: Any, url: str, calls: int, out: dict[str, list[float]]
) -> None:
    """One harness conversation; per call: the endpoint's time, the bare time and the session
    backend's time for the same prompt, and the loop's time for the same turn."""
    harness.ask(op="open", kind=kind, socket=ep.socket_path, token=ep.token, server=url)
    loop = open_session(url, f"loop-{ep.ctx.rollout_id}")
    for n in range(calls):
        endpoint_cpu = time.process_time()
        took = harness.ask(op="call", stream=False)
        endpoint_cpu = time.process_time() - endpoint_cpu  # this process: the endpoint's threads
        ids = sent_ids(ep)
        bare = harness.ask(op="bare", ids=ids, stream=False)
        direct, direct_cpu = direct_call(backend, url, ids)
        step = "first" if n == 0 else "merged"
        out[f"{kind}:{step}"].append(took["wall"])
        out[f"bare:{step}"].append(bare["wall"])
        out[f"direct:{step}"].append(direct)
        out[f"added:{kind}"].append(took["wall"] - bare["wall"])  # paired: same moment, same prompt
        out[f"added_cpu:{kind}"].append(took["cpu"] + endpoint_cpu - bare["cpu"])
        out[f"added_vs_backend:{kind}"].append(took["wall"] - direct)
        loop_wall, loop_cpu = loop_turn(loop, n, FIRST_MESSAGES)
        out[f"loop:{step}"].append(loop_wall)
        out[f"added_vs_loop:{kind}"].append(took["wall"] - loop_wall)
    traj = ep.runner.tracker.current.trajectory
    same = loop.trajectory().response_ids == traj.response_ids and loop.trajectory().prompt_ids == traj.prompt_ids
    out["same_ids_as_loop"].append(float(same))
    loop.close()


def ttft_conversation(
    harness: Harness, ep: Any, backend: Any, url: str, calls: int, out: dict[str, list[float]]
) -> None:
    """One streamed conversation: per call, the endpoint's TTFT and the server's own for the
    same prompt ids (the same harness client straight to it; the session's backend client)."""
    harness.ask(op="open", kind="httpx", socket=ep.socket_path, token=ep.token, server=url)
    for _ in range(calls):
        ttft = harness.ask(op="call", stream=True)["ttft"]
        ttft_server = first_chunk_seconds(url)
        ids = sent_ids(ep)
        bare = harness.ask(op="bare", ids=ids, stream=True)["ttft"]
        bare_server = first_chunk_seconds(url)
        server = direct_ttft(backend, url, ids)
        out["ttft:endpoint"].append(ttft)
        out["ttft:server"].append(bare)
        out["ttft:server_backend"].append(server)
        out["ttft_added"].append(ttft - bare)
        out["ttft_added_vs_backend"].append(ttft - server)
        # the simulator's own time to its first chunk (its paced sleep) taken out of both
        out["ttft_added_net"].append((ttft - ttft_server) - (bare - bare_server))


def first_chunk_seconds(url: str) -> float:
    """The simulator's time from handling the last streamed request to writing its first chunk."""
    import httpx

    return float(httpx.get(f"{url}/sim/stats", timeout=10).json()["last_stream_first_ms"]) / 1000


def summary(values: list[float]) -> dict[str, float]:
    ms = sorted(v * 1000 for v in values)
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 3),
        "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 3),
        "mean_ms": round(statistics.fmean(ms), 3),
    }


def main() -> None:
    if sys.argv[1:] == ["--harness-process"]:
        return harness_main()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--ttft-conversations", type=int, default=6)
    parser.add_argument("--ttft-latency", type=float, default=0.3, help="seconds per streamed reply")
    args = parser.parse_args()
    from collections import defaultdict

    from agents.llm.backends import get_backend_class

    tmp = Path(tempfile.mkdtemp(prefix="raas-bench-ep-", dir="/tmp"))
    backend = get_backend_class("vllm")()
    out: dict[str, list[float]] = defaultdict(list)
    harness = Harness()
    try:
        url, stop = start_server(tmp)
        try:
            for k, kind in enumerate(["httpx", "openai"]):  # warm-up: imports, caches
                with open_endpoint(url, tmp, 1000 + k) as ep:
                    conversation(harness, ep, kind, backend, url, 3, defaultdict(list))
            for k in range(args.conversations):
                kind = "httpx" if k % 2 == 0 else "openai"
                with open_endpoint(url, tmp, k) as ep:
                    conversation(harness, ep, kind, backend, url, args.calls, out)
        finally:
            stop()
        url, stop = start_server(tmp, STREAMED_REPLY, args.ttft_latency)
        try:
            for k in range(args.ttft_conversations + 1):  # the first: warm-up
                with open_endpoint(url, tmp, 2000 + k) as ep:
                    ttft_conversation(harness, ep, backend, url, args.calls, out if k else defaultdict(list))
        finally:
            stop()
    finally:
        harness.close()
    report(out, args)


def report(out: dict[str, list[float]], args: argparse.Namespace) -> None:
    rows = {key: summary(values) for key, values in sorted(out.items()) if key != "same_ids_as_loop"}
    figures: dict[str, Any] = {
        "conversations": args.conversations,
        "calls": args.calls,
        "latency": rows,
        "bare": summary(out["bare:first"] + out["bare:merged"]),
    }
    for kind in ("httpx", "openai"):
        figures[f"added_p50_ms_{kind}"] = rows[f"added:{kind}"]["p50_ms"]
        figures[f"added_cpu_p50_ms_{kind}"] = rows[f"added_cpu:{kind}"]["p50_ms"]
        figures[f"added_vs_backend_p50_ms_{kind}"] = rows[f"added_vs_backend:{kind}"]["p50_ms"]
        figures[f"added_vs_loop_p50_ms_{kind}"] = rows[f"added_vs_loop:{kind}"]["p50_ms"]
    figures["same_ids_as_loop"] = all(out["same_ids_as_loop"])
    figures["goal_added_p50_ms"] = 1.0
    if out["ttft_added"]:
        figures["ttft_p50_ms_endpoint"] = rows["ttft:endpoint"]["p50_ms"]
        figures["ttft_p50_ms_server"] = rows["ttft:server"]["p50_ms"]
        figures["ttft_added_p50_ms"] = rows["ttft_added"]["p50_ms"]
        figures["ttft_added_vs_backend_p50_ms"] = rows["ttft_added_vs_backend"]["p50_ms"]
        figures["ttft_added_net_p50_ms"] = rows["ttft_added_net"]["p50_ms"]
        figures["goal_ttft_added_p50_ms"] = 2.0
    figures["loadavg_1min"] = float(Path("/proc/loadavg").read_text().split()[0])
    print(json.dumps(figures))
    print(f"\n{'path':<28} {'n':>5} {'p50 ms':>9} {'p90 ms':>9} {'mean ms':>9}")
    for key, row in rows.items():
        print(f"{key:<28} {row['n']:>5} {row['p50_ms']:>9.3f} {row['p90_ms']:>9.3f} {row['mean_ms']:>9.3f}")
    print(
        f"\nadded p50 (endpoint - the same prompt by the same harness straight to the server, paired "
        f"per call): httpx {figures['added_p50_ms_httpx']} ms wall / {figures['added_cpu_p50_ms_httpx']} ms "
        f"CPU; openai SDK {figures['added_p50_ms_openai']} ms wall / {figures['added_cpu_p50_ms_openai']} ms "
        f"CPU (goal <= 1 ms; load average {figures['loadavg_1min']} on {os.cpu_count()} CPUs)"
    )
    print(
        f"against the session's backend client (p50, paired): httpx {figures['added_vs_backend_p50_ms_httpx']} "
        f"ms, openai SDK {figures['added_vs_backend_p50_ms_openai']} ms; over a raas handler's loop doing the "
        f"same turn: httpx {figures['added_vs_loop_p50_ms_httpx']} ms, openai SDK "
        f"{figures['added_vs_loop_p50_ms_openai']} ms; same token ids as the loop: {figures['same_ids_as_loop']}"
    )
    if out["ttft_added"]:
        print(
            f"time to first token, streamed (p50): endpoint {figures['ttft_p50_ms_endpoint']} ms, server's own "
            f"{figures['ttft_p50_ms_server']} ms (the same client), added {figures['ttft_added_p50_ms']} ms paired "
            f"(goal <= 2 ms; against the session's backend client {figures['ttft_added_vs_backend_p50_ms']} ms)"
        )
        print(
            f"  with the simulator's own time to its first chunk taken out of both (its paced sleep): "
            f"added {figures['ttft_added_net_p50_ms']} ms"
        )


if __name__ == "__main__":
    main()
