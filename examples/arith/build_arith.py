"""Write the arithmetic set for the `plain_answer` agent: a train and a held-out split.

Why this set: a 135M model gets some of these right (single-digit sums and products) and some
wrong, so GRPO groups have reward variance from the first step, and the held-out split (pairs
never trained on) shows whether the policy learned arithmetic or memorised the questions.
Every (a, op, b) with single-digit operands appears in exactly one split; the split is a
seeded shuffle, so the files are reproducible:

    python examples/arith/build_arith.py [--seed 0] [--heldout 40] [--out examples/arith]

Rows are the repository's example JSONL form (`instance_id` + the handler's fields), ready for
`raas submit examples/arith/train.jsonl --agent plain_answer`.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

OPERATIONS = {"+": lambda a, b: a + b, "*": lambda a, b: a * b}


def all_problems(operand_max: int = 9) -> list[dict[str, object]]:
    """Every single-digit `a op b`, as instances (`question`, `answer`, and the parts)."""
    rows = []
    for op, fn in OPERATIONS.items():
        for a in range(operand_max + 1):
            for b in range(operand_max + 1):
                name = "add" if op == "+" else "mul"
                rows.append(
                    {
                        "instance_id": f"arith-{name}-{a}-{b}",
                        "question": f"What is {a} {op} {b}?",
                        "answer": str(fn(a, b)),
                    }
                )
    return rows


def split(
    rows: list[dict[str, object]], heldout: int, seed: int
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """(train, held-out): a seeded shuffle, the first `heldout` rows held out; both sorted."""
    shuffled = list(rows)
    random.Random(seed).shuffle(shuffled)
    key = lambda r: r["instance_id"]  # noqa: E731 - stable file order
    return sorted(shuffled[heldout:], key=key), sorted(shuffled[:heldout], key=key)


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> None:
    """One JSON object per line."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main() -> None:
    """Parse arguments and write train.jsonl and heldout.jsonl."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heldout", type=int, default=40, help="problems held out")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args()
    train, heldout = split(all_problems(), args.heldout, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.out / "train.jsonl", train)
    write_jsonl(args.out / "heldout.jsonl", heldout)
    print(f"{len(train)} train, {len(heldout)} held-out problems in {args.out}")


if __name__ == "__main__":
    main()
