"""Re-tokenization drift: the naive decode -> re-encode pipeline versus the token-exact builder.

For each multi-turn conversation with tool calls, the "sampled" ids of every assistant turn are
kept by the builder verbatim; the naive pipeline decodes the conversation to text and tokenizes
a full re-render of it (what many agent frameworks do between turns). A trajectory counts as
drifted when the two disagree anywhere (the builder's drift audit measures exactly that). The
builder's own check: every turn's ids in the trajectory equal the ids the server sampled.

Sources of sampled ids:
  * `--vllm-url URL`: a real vLLM (SmolLM2-135M-Instruct on CPU) samples every turn;
  * always: a synthetic sampler over the same tokenizer, which writes tool-call turns and, like
    a model at temperature 1, sometimes samples a non-canonical split of a token (rate
    `--split-rate`), stops on length, or thinks in `<think>` blocks (Qwen-style template).

For drifted trajectories it also reports how much drifted: tokens that differ after aligning
the trajectory with the re-render (the audit's `retokenization_drift`) against the count of
differing positions the audit used to report (every token after one split counted).

Also reports the builder's per-turn overhead (render + tokenize the delta, append the turn), in
microseconds. Run: `.venv/bin/python bench/drift.py [--vllm-url http://127.0.0.1:8000]`.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agents.llm.tokenizer import ChatTokenizer, load_chat_tokenizer  # noqa: E402
from agents.llm.trajectory import TrajectoryBuilder  # noqa: E402

TOKENIZER = str(ROOT / "tests/fixtures/smollm2-tokenizer")
QWEN_TEMPLATE = str(ROOT / "tests/fixtures/qwen-style-template/chat_template.jinja")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]
COMMANDS = [
    "ls -la",
    "cat README.md",
    "grep -rn 'def main' src/",
    "python -m pytest -q",
    "git diff --stat",
    "echo $((17 * 23))",
    "find . -name '*.py' | wc -l",
    "pwd",
]
WORDS = (
    "the file contains a function that parses tokens; re-running tests shows 3 failures "
    "in test_parser.py because unicode café naïve strings are split differently"
).split()
IM_END = 2


def split_token(tok: ChatTokenizer, token_id: int, rng: random.Random) -> list[int]:
    """A non-canonical split of one token into two vocab tokens with the same bytes, if any."""
    piece = tok.hf.convert_ids_to_tokens(token_id)
    cuts = list(range(1, len(piece)))
    rng.shuffle(cuts)
    for cut in cuts:
        left, right = (tok.hf.convert_tokens_to_ids(p) for p in (piece[:cut], piece[cut:]))
        if left is not None and right is not None and tok.hf.unk_token_id not in (left, right):
            return [left, right]
    return [token_id]


def sample_ids(tok: ChatTokenizer, text: str, rng: random.Random, split_rate: float, length_cut: bool) -> list[int]:
    """Ids a model could have sampled for `text`: canonical, sometimes split, maybe cut short."""
    ids: list[int] = []
    for token_id in tok.encode(text):
        ids += split_token(tok, token_id, rng) if rng.random() < split_rate else [token_id]
    if length_cut:
        return ids[: max(1, len(ids) * 2 // 3)]
    return ids + [IM_END]


def assistant_text(rng: random.Random, think: bool, turn: int) -> str:
    """A tool-calling turn, optionally with a <think> block; the last turn answers."""
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12)))
    head = f"<think>\n{words}\n</think>\n\n" if think else ""
    if turn == 2:
        return head + "Done: " + words
    calls = [json.dumps({"name": "bash", "arguments": {"cmd": rng.choice(COMMANDS)}}) for _ in range(rng.randint(1, 2))]
    return head + words + "\n" + "\n".join(f"<tool_call>\n{c}\n</tool_call>" for c in calls)


def synthetic_run(n: int, template: str | None, think: bool, split_rate: float, length_rate: float, seed: int) -> dict:
    """Build n synthetic 3-turn conversations; count naive and builder drift, time the builder."""
    tok = load_chat_tokenizer(TOKENIZER, Path(template).read_text() if template else None)
    rng = random.Random(seed)
    naive = builder_bad = 0
    turn_us: list[float] = []
    aligned: list[int] = []  # differing tokens after alignment, per drifted trajectory
    shifted: list[int] = []  # differing positions (the audit's count before issue 12)
    for i in range(n):
        b = TrajectoryBuilder(tok, max_model_len=8192)
        b.start(
            [
                {"role": "system", "content": "You fix repositories."},
                {"role": "user", "content": f"Task {i}: make the tests pass."},
            ],
            TOOLS,
        )
        sampled: list[list[int]] = []
        for turn in range(3):
            ids = sample_ids(tok, assistant_text(rng, think, turn), rng, split_rate, rng.random() < length_rate)
            sampled.append(ids)
            started = time.perf_counter()
            b.add_generation(ids, [-0.1] * len(ids), "stop" if ids[-1] == IM_END else "length", "w")
            if turn == 0:
                b.add_messages([{"role": "tool", "content": rng.choice(WORDS) * rng.randint(1, 5)}])
            elif turn == 1:  # a user turn: Qwen-style templates drop earlier <think> blocks
                b.add_messages([{"role": "user", "content": "Looks good, finish up."}])
            turn_us.append((time.perf_counter() - started) * 1e6)
        report = b.audit_drift()
        if report["retokenization_drift"] > 0:
            naive += 1
            aligned.append(report["retokenization_drift"])
            shifted.append(shifted_positions(b))
        builder_bad += exact_mismatch(b, sampled)
    return {
        "n": n,
        "naive_drifted": naive,
        "builder_drifted": builder_bad,
        "aligned_median": statistics.median(aligned) if aligned else 0,
        "shifted_median": statistics.median(shifted) if shifted else 0,
        "turn_us_median": statistics.median(turn_us),
        "turn_us_p95": sorted(turn_us)[int(len(turn_us) * 0.95)],
    }


def shifted_positions(b: TrajectoryBuilder) -> int:
    """Positions where the trajectory and a full re-render differ, without alignment."""
    traj = b.trajectory()
    built, reference = traj.prompt_ids + traj.response_ids, b.reference_ids()
    return sum(
        1
        for i in range(max(len(built), len(reference)))
        if i >= len(built) or i >= len(reference) or built[i] != reference[i]
    )


def exact_mismatch(b: TrajectoryBuilder, sampled: list[list[int]]) -> bool:
    """True if any turn's ids in the trajectory differ from the ids that were sampled."""
    traj = b.trajectory()
    got = [traj.response_ids[s:e] for s, e in traj.turn_boundaries]
    return got != sampled


def vllm_run(url: str, n: int, concurrency: int, max_tokens: int) -> dict:
    """n real 3-turn conversations sampled by a vLLM server; the same two counts."""
    from agents.llm import LLMSession

    spec = {"servers": [{"url": url}], "tokenizer": TOKENIZER, "max_model_len": 2048}
    sampling = {"temperature": 1.0, "max_tokens": max_tokens}
    rng = random.Random(0)
    prompts = [rng.choice(COMMANDS) for _ in range(n)]

    def one(i: int) -> tuple[bool, bool, int]:
        with LLMSession.open(spec, sampling, f"drift-{i}") as s:
            s.start(
                [
                    {
                        "role": "system",
                        "content": "You are a shell assistant. To run a command, "
                        'write <tool_call>{"name": "bash", "arguments": {"cmd": "..."}}</tool_call>.',
                    },
                    {"role": "user", "content": f"Run `{prompts[i]}` and explain the output."},
                ]
            )
            sampled = []
            for turn in range(3):
                generation = s.generate(time.monotonic() + 600)
                sampled.append(generation.token_ids)
                if turn < 2:
                    s.append_messages([{"role": "tool", "content": f"output of {prompts[i]}: ok"}])
            return (
                s.audit_drift()["retokenization_drift"] > 0,
                exact_mismatch(s.builder, sampled),
                sum(len(x) for x in sampled),
            )

    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, range(n)))
    return {
        "n": n,
        "naive_drifted": sum(r[0] for r in results),
        "builder_drifted": sum(r[1] for r in results),
        "generated_tokens": sum(r[2] for r in results),
        "seconds": round(time.monotonic() - started, 1),
    }


def main() -> None:
    """Run the synthetic sets (and the real-model set when a vLLM url is given); print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="conversations per set")
    parser.add_argument("--split-rate", type=float, default=0.01, help="non-canonical splits")
    parser.add_argument("--length-rate", type=float, default=0.1, help="turns cut on length")
    parser.add_argument("--vllm-url", help="real vLLM server to sample from")
    parser.add_argument("--vllm-n", type=int, default=200, help="real conversations")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    split, cut = args.split_rate, args.length_rate
    sets = {
        "ChatML (SmolLM2), canonical samples": synthetic_run(args.n, None, False, 0, 0, 1),
        f"ChatML, {cut:.0%} of turns cut on length": synthetic_run(args.n, None, False, 0, cut, 2),
        f"ChatML, {split:.1%} of tokens split": synthetic_run(args.n, None, False, split, 0, 3),
        "Qwen-style + tools + <think>, then a user turn": synthetic_run(args.n, QWEN_TEMPLATE, True, 0, 0, 4),
        "Qwen-style, all of the above": synthetic_run(args.n, QWEN_TEMPLATE, True, split, cut, 5),
    }
    if args.vllm_url:
        sets["real SmolLM2-135M via vLLM (CPU)"] = vllm_run(
            args.vllm_url, args.vllm_n, args.concurrency, args.max_tokens
        )
    if args.json:
        print(json.dumps(sets, indent=2))
        return
    print(
        "| set | conversations | naive drifted | builder drifted | builder µs/turn (median, p95) "
        "| drifted tokens after alignment (median) | shifted positions (median) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, r in sets.items():
        timing = (
            f"{r['turn_us_median']:.0f}, {r['turn_us_p95']:.0f}"
            if "turn_us_median" in r
            else f"({r['generated_tokens']} tokens sampled in {r['seconds']} s)"
        )
        rate = 100.0 * r["naive_drifted"] / r["n"]
        print(
            f"| {name} | {r['n']} | {r['naive_drifted']} ({rate:.1f}%) | "
            f"{r['builder_drifted']} | {timing} | {r.get('aligned_median', '-')} | "
            f"{r.get('shifted_median', '-')} |"
        )


if __name__ == "__main__":
    main()
