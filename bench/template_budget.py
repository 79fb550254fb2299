"""Cost of rendering chat templates under the issue-22 budget, and what the bounded checks take.

- per render (every turn in a RUN worker): the tokenizer's chat template through
  `ChatTokenizer.render` (deadline, range/repetition caps, output cap) vs the same template
  through transformers directly, on a 20-message chat;
- per submission with an inline template: the bounded child, forked by the template checker
  process (`check_untrusted_template`), against the same child forked from this process
  (`check_template_here`, what the gateway did before the checker);
- the attack: nested `range()` loops (64 M iterations) in the child: refused within its wall
  deadline;
- two tenants: while tenant a has 4 bomb templates in check at once, how long tenant b's sound
  template waits, on the pool (`CheckerPool()`: each owner in turn, up to 3 checkers) against
  one checker for everyone (`CheckerPool(size=1)`, what the gateway had before the pool).
Prints JSON + a table. `.venv/bin/python bench/template_budget.py`
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import threading  # noqa: E402

from agents.llm.template_checker import CheckerPool, check_untrusted_template  # noqa: E402
from agents.llm.tokenizer import check_template_here, load_chat_tokenizer  # noqa: E402
from core.errors import InvalidRequest  # noqa: E402

TOKENIZER = str(REPO / "tests" / "fixtures" / "smollm2-tokenizer")
CHAT = [{"role": "user", "content": "hello " * 50}, {"role": "assistant", "content": "hi " * 50}]
BOMB = (
    "{% for m in messages %}{{ m['content'] }}{% endfor %}{% for a in range(400) %}"
    "{% for b in range(400) %}{% for c in range(400) %}{% endfor %}{% endfor %}{% endfor %}"
)


def per_call(fn, n: int) -> float:
    """Median milliseconds of `fn()` over 5 batches of n calls."""
    batches = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        batches.append((time.perf_counter() - t0) / n * 1000)
    return statistics.median(batches)


def other_tenant_wait(pool: CheckerPool, template: str, bombs: int = 4) -> float:
    """Seconds tenant b's sound check takes while tenant a's `bombs` checks are in flight."""
    warm = [threading.Thread(target=pool.check, args=(TOKENIZER, template, o)) for o in "ab"]
    for thread in warm:  # at once: as many checkers as the pool starts, each with the tokenizer
        thread.start()
    for thread in warm:
        thread.join()

    def bomb() -> None:
        try:
            pool.check(TOKENIZER, BOMB, "a")
        except InvalidRequest:
            pass

    threads = [threading.Thread(target=bomb) for _ in range(bombs)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)  # a's checks queued first
    t0 = time.perf_counter()
    pool.check(TOKENIZER, template, "b")
    waited = time.perf_counter() - t0
    for thread in threads:
        thread.join()
    pool.close()
    return waited


def main() -> None:
    tok = load_chat_tokenizer(TOKENIZER)
    messages = CHAT * 10
    budgeted = per_call(lambda: tok.render(messages), 100)
    direct = per_call(lambda: tok.hf.apply_chat_template(messages, chat_template=tok.template, tokenize=False), 100)
    template = (Path(TOKENIZER) / "chat_template.jinja").read_text()
    check_untrusted_template(TOKENIZER, template)  # warm: the plain tokenizer is loaded
    check_template_here(TOKENIZER, template)
    checks, here = [], []
    for _ in range(9):  # alternating: the same noise on both
        t0 = time.perf_counter()
        check_untrusted_template(TOKENIZER, template)
        checks.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        check_template_here(TOKENIZER, template)
        here.append((time.perf_counter() - t0) * 1000)
    t0 = time.perf_counter()
    try:
        check_untrusted_template(TOKENIZER, BOMB)
        bomb = "accepted"
    except InvalidRequest as exc:
        bomb = exc.message[:90]
    bomb_s = time.perf_counter() - t0
    one_checker = other_tenant_wait(CheckerPool(size=1), template)
    pooled = other_tenant_wait(CheckerPool(), template)
    result = {
        "render_ms_budgeted": round(budgeted, 3),
        "render_ms_direct": round(direct, 3),
        "budget_overhead_us": round((budgeted - direct) * 1000, 1),
        "submission_check_ms_median": round(statistics.median(checks), 1),
        "submission_check_in_process_ms_median": round(statistics.median(here), 1),
        "bomb_refused_after_s": round(bomb_s, 2),
        "bomb_answer": bomb,
        "other_tenant_wait_s_one_checker": round(one_checker, 2),
        "other_tenant_wait_s_pool": round(pooled, 2),
    }
    print(json.dumps(result))
    print(f"{'render, 20 messages (budgeted)':40} {budgeted:8.3f} ms")
    print(f"{'render, 20 messages (transformers)':40} {direct:8.3f} ms")
    print(f"{'submission check (checker process)':40} {statistics.median(checks):8.1f} ms")
    print(f"{'submission check (forked from here)':40} {statistics.median(here):8.1f} ms")
    print(f"{'64 M-iteration template refused after':40} {bomb_s:8.2f} s")
    print(f"{'tenant b behind 4 bombs, one checker':40} {one_checker:8.2f} s")
    print(f"{'tenant b behind 4 bombs, the pool':40} {pooled:8.2f} s")


if __name__ == "__main__":
    main()
