"""GRPO through raas on CPU: sample groups, train on the stored tokens, push, repeat.

Each step submits `--instances` training problems x `--samples` to raas (agent
`plain_answer`), collects the finished groups (token ids, loss mask, the behaviour policy's
logprobs, reward, per-turn weight versions), takes one AdamW step on the clipped GRPO loss
and pushes the new weights (verified against a probe) before the next rollouts sample.
`--mode async` is one-step-off-policy: the rollouts of step k+1 are submitted before step k
trains, so vLLM generates while torch trains; the push pauses the pool at a turn boundary and
each sample's recorded versions are checked against `--max-staleness`.

Every `--eval-every` steps (and before the first and after the last) the held-out split is
graded greedily (temperature 0) through raas. One CSV row per step goes to `--out`/steps.csv.

    .venv-train/bin/python examples/train/train.py --raas URL --vllm URL \
        --server-id ID --model-dir models/smollm2-135m-untied --out runs/x [--mode async]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # grpo, policy, push beside us

import torch

from grpo import BatchStats, build_samples
from policy import load_policy, save_weights, sequence_logprobs, train_step
from push import push_via_service, push_weights
from raas_client import RolloutView

REPO = Path(__file__).resolve().parents[2]
COLUMNS = [
    "step",
    "version",
    "mode",
    "reward",
    "heldout_acc",
    "heldout_acc_long",
    "rollouts",
    "samples",
    "groups",
    "groups_no_variance",
    "infra_excluded",
    "stale_excluded",
    "gen_tokens",
    "mean_reply_tokens",
    "logprob_gap",
    "ratio_mean",
    "clip_fraction",
    "loss",
    "grad_norm",
    "rollout_s",
    "train_s",
    "push_s",
    "push_pause_s",
    "probe_gap",
    "eval_s",
    "wall_s",
    "load_avg",
]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of an example set."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Trainer:
    """The loop's state: the policy, its optimiser, the raas client and the version."""

    def __init__(self, args: argparse.Namespace) -> None:
        from transformers import AutoTokenizer

        from raas_client import RaasClient

        self.args = args
        self.raas = RaasClient(args.raas, timeout=600)
        self.model = load_policy(args.model_dir, args.lora_rank, args.threads)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
        from raas_client.weights import DEFAULT_PROBE_TEXT

        self.tokenizer = tok = AutoTokenizer.from_pretrained(args.model_dir)
        # > 128 tokens: a full block in vLLM's prefix cache, so a cache not reset after the
        # load shows in the probe (a short probe is never cached and would pass).
        self.probe_ids = list(tok(DEFAULT_PROBE_TEXT)["input_ids"])
        self.train_set, self.heldout = read_jsonl(args.train), read_jsonl(args.heldout)
        # The service's verified push when this SDK has it (h-weights), else our own.
        self.use_service_push = args.push == "service" or (args.push == "auto" and hasattr(self.raas, "push_weights"))
        self.rng = random.Random(args.seed)
        self.version = 0
        self.weights = Path(args.weights_dir)
        self.run_id = f"grpo-{os.getpid()}-{int(time.time())}"

    # -- raas ---------------------------------------------------------------------------
    def submit(
        self, rows: list[dict[str, Any]], n: int, temperature: float, tag: str, max_tokens: int | None = None
    ) -> str:
        """One raas job of `plain_answer` rollouts; returns its id."""
        a = self.args
        job = self.raas.submit(
            "plain_answer",
            rows,
            n_samples=n,
            idempotency_key=f"{self.run_id}-{tag}",
            sampling={"temperature": temperature, "max_tokens": max_tokens or a.max_tokens},
            limits={"max_turns": 1, "max_staleness": a.max_staleness, "run_timeout": 1800},
            llm={"max_model_len": 2048},
        )
        return job.job_id

    def submit_batch(self, step: int) -> str:
        """The training rollouts of `step`: random training problems x samples, T=1."""
        rows = self.rng.sample(self.train_set, self.args.instances)
        return self.submit(rows, self.args.samples, self.args.temperature, f"train-{step}")

    def evaluate(self, max_tokens: int | None = None) -> tuple[float, float]:
        """Greedy accuracy on the held-out split (reward 1 = right), and seconds taken."""
        started = time.monotonic()
        job = self.submit(self.heldout, 1, 0.0, f"eval-v{self.version}-{max_tokens}", max_tokens)
        rewards = [
            r.reward or 0.0 for r in self.raas.results(job, wait=30) if r.outcome not in ("infra_error", "cancelled")
        ]
        return sum(rewards) / max(len(rewards), 1), time.monotonic() - started

    def evaluate_long(self) -> float | str:
        """Held-out greedy accuracy with `--long-eval-max-tokens` per reply ('' if unset): the
        same policy judged without the training cap on reply length."""
        if not self.args.long_eval_max_tokens:
            return ""
        return round(self.evaluate(self.args.long_eval_max_tokens)[0], 4)

    # -- weights ------------------------------------------------------------------------
    def push(self) -> Any:
        """Save the policy as version `self.version` and push it (keeps the last folders that
        rollouts may still be generated from: max_staleness + 1)."""
        a = self.args
        path = self.weights / f"v{self.version}"
        save_seconds = save_weights(self.model, path, lora=a.lora_rank > 0)
        lora_name = a.served_model_name if a.lora_rank > 0 else None
        logprobs = lambda p, r: sequence_logprobs(self.model, p, r)  # noqa: E731
        if self.use_service_push:
            from raas_client.weights import probe_fingerprint

            probe = probe_fingerprint(self.model, self.tokenizer, self.probe_ids)
            figures = push_via_service(
                self.raas, str(path), f"v{self.version}", probe, lora_name=lora_name, tolerance=a.probe_tolerance
            )
        else:
            figures = push_weights(
                self.raas,
                a.server_id,
                a.vllm,
                str(path),
                f"v{self.version}",
                model_name=a.served_model_name,
                probe_ids=self.probe_ids,
                trainer_logprobs=logprobs,
                lora_name=lora_name,
                tolerance=a.probe_tolerance,
            )
        keep = (a.max_staleness or 0) + 1
        for old in sorted(self.weights.glob("v*"), key=lambda p: int(p.name[1:]))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        return figures, save_seconds

    # -- one step -----------------------------------------------------------------------
    def collect(self, job_id: str) -> list[list[RolloutView]]:
        """Every group of the job (raas yields a group when its last sample finishes)."""
        return list(self.raas.groups(job_id, wait=30))

    def learn(self, groups: list[list[RolloutView]]) -> tuple[BatchStats, Any]:
        """Samples from the groups, then one optimiser step (None when no group had signal)."""
        samples, stats = build_samples(groups, self.version, self.args.max_staleness)
        if not samples:
            return stats, None
        return stats, train_step(
            self.model, self.optimizer, samples, self.args.clip, self.args.max_grad_norm, self.args.micro_batch
        )


def step_row(
    step: int,
    trainer: Trainer,
    groups: list[list[RolloutView]],
    stats: BatchStats,
    figures: Any,
    timing: dict[str, float],
    push: Any,
) -> dict[str, Any]:
    """The CSV row of one step."""
    rows = [r for g in groups for r in g]
    gen = [sum(r.loss_mask or []) for r in rows]
    row = {
        "step": step,
        "version": trainer.version,
        "mode": trainer.args.mode,
        "reward": round(stats.mean_reward, 4),
        "rollouts": stats.rollouts,
        "samples": stats.samples,
        "groups": stats.groups,
        "groups_no_variance": stats.groups_no_variance,
        "infra_excluded": stats.infra_excluded,
        "stale_excluded": stats.stale_excluded,
        "gen_tokens": sum(gen),
        "mean_reply_tokens": round(sum(gen) / max(len(gen), 1), 1),
        "load_avg": round(os.getloadavg()[0], 2),
        **{k: round(v, 4) if isinstance(v, float) else v for k, v in timing.items()},
    }
    if figures is not None:
        row.update(
            logprob_gap=f"{figures.logprob_gap:.2e}",
            ratio_mean=round(figures.ratio_mean, 5),
            clip_fraction=round(figures.clip_fraction, 4),
            loss=round(figures.loss, 5),
            grad_norm=round(figures.grad_norm, 4),
        )
    if push is not None:
        row.update(push_pause_s=round(push.pause_seconds, 3), probe_gap=f"{push.probe_gap:.2e}")
    return row


def log_rollouts(handle: Any, step: int, version: int, groups: list[list[RolloutView]]) -> None:
    """One line per rollout (rollouts.jsonl): what it was sampled with, per turn, and its
    reward; what a reader checks the staleness bound and the pushes against."""
    for row in (r for g in groups for r in g):
        handle.write(
            json.dumps(
                {
                    "step": step,
                    "trainer_version": f"v{version}",
                    "rollout_id": row.rollout_id,
                    "instance_id": row.instance_id,
                    "outcome": row.outcome,
                    "reward": row.reward,
                    "policy_versions": row.policy_versions,
                    "generated_tokens": sum(row.loss_mask or []),
                }
            )
            + "\n"
        )
    handle.flush()


def run(args: argparse.Namespace) -> Path:
    """The loop; returns the CSV path."""
    trainer = Trainer(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "steps.csv"
    handle = csv_path.open("w", newline="")
    writer = csv.DictWriter(handle, fieldnames=COLUMNS)
    writer.writeheader()
    rollouts_log = (out / "rollouts.jsonl").open("w")
    started = time.monotonic()
    push0, _ = trainer.push()  # v0: verifies the served model is the trainer's before step 1
    acc, eval_s = trainer.evaluate()
    writer.writerow(
        {
            "step": 0,
            "version": 0,
            "mode": args.mode,
            "heldout_acc": round(acc, 4),
            "heldout_acc_long": trainer.evaluate_long(),
            "eval_s": round(eval_s, 2),
            "push_pause_s": round(push0.pause_seconds, 3),
            "probe_gap": f"{push0.probe_gap:.2e}",
            "wall_s": round(time.monotonic() - started, 1),
        }
    )
    handle.flush()
    print(f"step 0: held-out greedy accuracy {acc:.3f} ({eval_s:.0f}s)", flush=True)
    pending = trainer.submit_batch(1) if args.mode == "async" else None
    step = 0
    while step < args.steps and time.monotonic() - started < args.time_budget:
        step += 1
        t0 = time.monotonic()
        job = pending or trainer.submit_batch(step)
        groups = trainer.collect(job)
        rollout_s = time.monotonic() - t0
        log_rollouts(rollouts_log, step, trainer.version, groups)
        more = step < args.steps and time.monotonic() - started < args.time_budget
        # one-step-off-policy: the next batch generates on the current weights while we train
        # (if the budget runs out during this step, it is cancelled unused)
        pending = trainer.submit_batch(step + 1) if args.mode == "async" and more else None
        t1 = time.monotonic()
        stats, figures = trainer.learn(groups)
        train_s = time.monotonic() - t1
        push = None
        push_s = 0.0
        if figures is not None:
            trainer.version += 1
            t2 = time.monotonic()
            push, _ = trainer.push()
            push_s = time.monotonic() - t2
        timing = {"rollout_s": rollout_s, "train_s": train_s, "push_s": push_s}
        # decided after the update: the last step always ends with a held-out eval
        last = step >= args.steps or time.monotonic() - started >= args.time_budget
        if step % args.eval_every == 0 or last:
            timing["heldout_acc"], timing["eval_s"] = trainer.evaluate()
        if last:
            timing["heldout_acc_long"] = trainer.evaluate_long()
        timing["wall_s"] = time.monotonic() - started
        row = step_row(step, trainer, groups, stats, figures, timing, push)
        writer.writerow(row)
        handle.flush()
        print(" ".join(f"{k}={row.get(k)}" for k in COLUMNS if row.get(k) not in (None, "")), flush=True)
    if pending:
        trainer.raas.cancel(pending)
    handle.close()
    rollouts_log.close()
    return csv_path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The loop's options (defaults: the recipe that learned here)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--raas", required=True, help="raas gateway URL")
    p.add_argument("--vllm", required=True, help="vLLM URL (dev mode) for the weight push")
    p.add_argument("--server-id", required=True, help="the vLLM's id in raas' pool")
    p.add_argument("--served-model-name", default="policy")
    p.add_argument("--model-dir", required=True, help="untied float32 model (trainer's start)")
    p.add_argument("--out", required=True, help="folder for steps.csv")
    p.add_argument("--weights-dir", default=f"/dev/shm/raas-train-{os.getpid()}")
    p.add_argument("--train", type=Path, default=REPO / "examples/arith/train.jsonl")
    p.add_argument("--heldout", type=Path, default=REPO / "examples/arith/heldout.jsonl")
    p.add_argument("--mode", choices=["sync", "async"], default="sync")
    p.add_argument("--lora-rank", type=int, default=0, help="0: full fine-tune")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--time-budget", type=float, default=1500, help="seconds for the loop")
    p.add_argument("--instances", type=int, default=8)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument(
        "--max-tokens", type=int, default=64, help="per reply, in training and the held-out eval (a cut reply scores 0)"
    )
    p.add_argument(
        "--long-eval-max-tokens",
        type=int,
        default=0,
        help="also grade the held-out split with this cap, first and last (0: no)",
    )
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--clip", type=float, default=0.2)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--max-staleness", type=int, default=1)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--probe-tolerance", type=float, default=1e-3)
    p.add_argument(
        "--push",
        choices=["auto", "service", "direct"],
        default="auto",
        help="service: raas' POST /v1/weights/push; direct: push.push_weights "
        "against vLLM's dev endpoints; auto: service if the SDK has it",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


if __name__ == "__main__":
    torch.manual_seed(0)
    print(f"steps: {run(parse_args())}")
