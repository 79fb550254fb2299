"""How long a trainer's wait survives gateway downtime: the SDK before (main at 635fdca, loaded
from git: 8 GET attempts with waits summing to 17.75 s, `stream()` without retry) against the
current SDK (backoff up to `RAAS_RETRY_TOTAL`, default 600 s; `stream()` resumes from its
cursor), in the same run, on the same job. Prints JSON + a table.

For each outage length: a job of 24 `test-sleepy` rollouts runs on the embedded default; four
trainers follow it through a `raas gateway` process (old/new `results()`, old/new `stream()`);
once each has a result, the gateway is SIGKILLed, kept down for the outage, and started again
on the same port. A trainer survives if it ends with every rollout exactly once, in order.

    .venv/bin/python bench/trainer_waits.py [--outages 30,120]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from raas_client import RaasClient  # noqa: E402
from bench.support.pipeline_harness import GatewayProcess  # noqa: E402
from bench.support.private_services import free_port  # noqa: E402
from bench.support.pipeline_harness import start_service, wait_for  # noqa: E402

BASELINE_COMMIT = "635fdca"
ROLLOUTS = 24


def baseline_sdk(tmp: Path) -> Any:
    """`client/sdk.py` as it was at BASELINE_COMMIT, imported as its own module."""
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{BASELINE_COMMIT}:client/sdk.py"], capture_output=True, text=True, check=True
    ).stdout
    path = tmp / "baseline_sdk.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("baseline_sdk", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Trainer(threading.Thread):
    """One follower of a job; records what it got and how it ended."""

    def __init__(self, name: str, items: Any) -> None:
        super().__init__(name=name, daemon=True)
        self.items_iter = items
        self.got: list[int] = []  # the seq of each rollout received
        self.error: str | None = None
        self.ended_at = 0.0

    def run(self) -> None:
        try:
            for item in self.items_iter:  # the baseline SDK's rows are dicts, today's RolloutView
                self.got.append(item["seq"] if isinstance(item, dict) else item.seq)
        except Exception as exc:  # noqa: BLE001 - the outcome being measured
            self.error = f"{type(exc).__name__}: {exc}"[:120]
        self.ended_at = time.monotonic()

    def outcome(self, killed_at: float) -> dict[str, Any]:
        seqs = self.got
        complete = seqs == list(range(1, ROLLOUTS + 1))
        return {
            "trainer": self.name,
            "survived": complete and self.error is None,
            "rollouts": len(seqs),
            "duplicates": len(seqs) - len(set(seqs)),
            "gave_up_after_s": round(self.ended_at - killed_at, 2) if self.error else None,
            "error": self.error or (None if complete else "ended before the job did"),
        }


def one_outage(svc: Any, gateway: GatewayProcess, old: Any, outage: float) -> list[dict]:
    """A job, four trainers, one gateway outage of `outage` seconds."""
    job = svc.client.submit(
        "test-sleepy",
        [{"instance_id": f"p{i}"} for i in range(12)],
        n_samples=2,
        agent_config={"run_s": 1.0, "turns": 2},
    ).job_id
    clients = {"before": old.RaasClient(gateway.url), "after": RaasClient(gateway.url)}
    trainers = [
        Trainer(f"{when} {how}()", getattr(c, how)(job, wait=30))
        for when, c in clients.items()
        for how in ("results", "stream")
    ]
    for t in trainers:
        t.start()
    wait_for(lambda: all(t.got or not t.is_alive() for t in trainers), timeout=300, what="a result at every trainer")
    gateway.kill()
    killed_at = time.monotonic()
    time.sleep(outage)
    gateway.start()
    for t in trainers:
        t.join(timeout=max(0.0, 120 - (time.monotonic() - killed_at - outage)))
    for c in clients.values():
        c.close()
    return [{"outage_s": outage, **t.outcome(killed_at)} for t in trainers]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outages", default="30,120", help="seconds, comma-separated")
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as home:
        old = baseline_sdk(Path(home))
        svc = start_service(Path(home) / "svc", concurrency=2)
        gateway = GatewayProcess(svc, free_port())
        try:
            gateway.start()
            for outage in (float(x) for x in args.outages.split(",")):
                rows += one_outage(svc, gateway, old, outage)
        finally:
            gateway.kill()
            svc.stop()
    print(json.dumps({"baseline": BASELINE_COMMIT, "rollouts": ROLLOUTS, "runs": rows}, indent=1))
    print(f"\n{'outage':>7} {'trainer':<18} {'survived':<9} {'rollouts':>8} {'dups':>5} {'gave up after':>14}")
    for r in rows:
        gave_up = f"{r['gave_up_after_s']:.2f} s" if r["gave_up_after_s"] is not None else "-"
        print(
            f"{r['outage_s']:>6.0f}s {r['trainer']:<18} {str(r['survived']):<9} "
            f"{r['rollouts']:>8} {r['duplicates']:>5} {gave_up:>14}"
        )


if __name__ == "__main__":
    main()
