"""Draw the reward curve of a training run (per-step reward, held-out greedy accuracy) and
print the per-step table as Markdown (what examples/train/README.md shows).

    .venv-train/bin/python examples/train/plot.py runs/x/steps.csv runs/x/reward.png
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path


def read_steps(path: Path) -> list[dict[str, str]]:
    """The CSV rows written by train.py."""
    with path.open() as handle:
        return list(csv.DictReader(handle))


def plot(rows: list[dict[str, str]], out: Path) -> None:
    """Reward per step (and its 5-step mean) and held-out accuracy on one axis, against wall
    minutes on the top axis' labels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(int(r["step"]), float(r["reward"])) for r in rows if r.get("reward")]
    evals = [(int(r["step"]), float(r["heldout_acc"])) for r in rows if r.get("heldout_acc")]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        steps, rewards = zip(*train)
        ax.plot(steps, rewards, ".", color="tab:blue", alpha=0.5, label="reward (T=1, per step)")
        means = [sum(rewards[max(0, i - 4) : i + 1]) / len(rewards[max(0, i - 4) : i + 1]) for i in range(len(rewards))]
        ax.plot(steps, means, "-", color="tab:blue", label="reward, mean of 5 steps")
    if evals:
        steps, acc = zip(*evals)
        ax.plot(steps, acc, "o-", color="tab:red", label="held-out greedy accuracy")
    wall = float(rows[-1].get("wall_s") or 0) / 60 if rows else 0
    ax.set_xlabel(f"step (the loop: {wall:.1f} min wall, setup not counted)")
    ax.set_ylim(0, 1)
    ax.set_ylabel("reward / accuracy")
    ax.set_title("GRPO through raas: SmolLM2-135M, CPU, single-digit arithmetic")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=100)


TABLE = [
    "step",
    "reward",
    "heldout_acc",
    "heldout_acc_long",
    "samples",
    "mean_reply_tokens",
    "logprob_gap",
    "clip_fraction",
    "rollout_s",
    "train_s",
    "push_s",
    "push_pause_s",
    "probe_gap",
    "wall_s",
    "load_avg",
]


def markdown(rows: list[dict[str, str]]) -> str:
    """The main columns of every step as a Markdown table ('' cells shown as -)."""
    lines = ["| " + " | ".join(TABLE) + " |", "|" + " --- |" * len(TABLE)]
    lines += ["| " + " | ".join(r.get(k) or "-" for k in TABLE) + " |" for r in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    steps = read_steps(Path(sys.argv[1]))
    plot(steps, Path(sys.argv[2]))
    print(markdown(steps))
    print(f"curve: {sys.argv[2]}")
