"""A gateway restart while trainers follow a job: nothing lost, nothing twice, no human step.

The gateway runs as its own process (`raas gateway`) so it can be SIGKILLed and started again
on the same port while the workers and the reaper go on. Meanwhile a trainer follows with the
SDK's `stream()`, another with `raas results --follow --out F` (itself SIGKILLed once and
resumed on a file with a torn last line), and `raas submit --wait --out F2` with a retry
budget shorter than the outage gives up in one line saying how to resume, which is then done.
Every follower must end with every rollout exactly once, a gapless result sequence, and the
rewards the EVAL stage computed. The outage is short (a few seconds, with retry budgets to
match) to keep the test lean; that the default budget is >= 10 minutes is a unit test
(tests/test_sdk_retry.py).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any


from raas_client import RaasClient
from tests.conftest import REDIS_URL
from bench.support.pipeline_harness import REPO, GatewayProcess, start_service, wait_for
from raas_client.models import RolloutView

OUTAGE_SECONDS = 6.0
INSTANCES = 12  # x 2 samples = 24 rollouts
SLEEPY = {"run_s": 1.0, "turns": 2}  # ~12 s of RUN on 2 slots: the outage falls mid-job


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raas(*args: str, env: dict[str, str], **kw: Any) -> subprocess.Popen:
    """The `raas` command as a child process (stdout and stderr captured as text)."""
    return subprocess.Popen(
        [sys.executable, "-m", "app.ops.cli", *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def running(proc: subprocess.Popen) -> bool:
    """True while `proc` runs; its output in the failure when it ended."""
    if proc.poll() is None:
        return True
    out, err = proc.communicate()
    raise AssertionError(f"{proc.args[3:]} exited {proc.returncode}:\n{out}\n{err}")


def rows_of(path: Path) -> list[RolloutView]:
    """The rows of a JSONL file (none while it does not exist)."""
    text = path.read_text() if path.exists() else ""
    return [RolloutView.model_validate_json(line) for line in text.splitlines() if line.strip()]


def assert_every_rollout_once(rows: list[RolloutView], ids: list[str], what: str) -> None:
    """Each rollout exactly once, seq 1..n without a gap, real rewards and tokens."""
    assert sorted(r.rollout_id for r in rows) == sorted(ids), what
    assert sorted(r.seq for r in rows) == list(range(1, len(ids) + 1)), what
    for r in rows:
        assert r.outcome == "completed" and r.reward == float(r.sample_index % 2), r
        assert r.prompt_ids == [1, 2, 3] and r.response_ids == [4, 5], r


def test_gateway_restart_while_trainers_follow(tmp_path, pg_url, redis_prefix):
    svc = start_service(tmp_path, db_url=pg_url, broker_url=REDIS_URL, key_prefix=redis_prefix, concurrency=2)
    gateway = GatewayProcess(svc, free_port())
    followers: list[subprocess.Popen] = []
    try:
        gateway.start()
        instances = tmp_path / "instances.jsonl"
        instances.write_text("".join(json.dumps({"instance_id": f"p{i}"}) + "\n" for i in range(INSTANCES)))
        job_file = tmp_path / "job.json"
        job_file.write_text(json.dumps({"agent_config": SLEEPY}))
        env = {**svc.env, "RAAS_URL": gateway.url}
        f1, f2 = tmp_path / "follow.jsonl", tmp_path / "submit.jsonl"
        submit = raas(
            "submit",
            str(instances),
            "--agent",
            "test-sleepy",
            "--n",
            "2",
            "--job",
            str(job_file),
            "--out",
            str(f2),
            env={**env, "RAAS_RETRY_TOTAL": "1"},
        )
        followers.append(submit)
        job_id = wait_for(
            lambda: running(submit) and f2.exists() and svc.client.jobs().jobs, timeout=120, what="the submission"
        )[0].job_id
        follow = raas("results", job_id, "--follow", "--out", str(f1), env={**env, "RAAS_RETRY_TOTAL": "60"})
        followers.append(follow)

        streamed: list[RolloutView] = []
        errors: list[BaseException] = []
        trainer = RaasClient(gateway.url, retry_total=60, retry_max_wait=0.5)

        def train() -> None:
            try:
                for item in trainer.stream(job_id, wait=5):
                    streamed.append(item)
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)

        thread = threading.Thread(target=train)
        thread.start()

        wait_for(
            lambda: running(follow) and len(rows_of(f1)) >= 3 and len(streamed) >= 3,
            timeout=120,
            what="the first results at both followers",
        )
        follow.send_signal(signal.SIGKILL)  # the follower dies too ...
        follow.wait(10)
        with f1.open("a") as f:
            f.write('{"rollout_id": "torn-by-a-cra')  # ... in the middle of a line
        gateway.kill()
        killed_at = len(streamed)
        time.sleep(OUTAGE_SECONDS)
        _, submit_err = submit.communicate(timeout=30)  # its 1 s budget is spent: one line
        gateway.start()

        resumed = raas("results", job_id, "--follow", "--out", str(f1), env=env)
        followers.append(resumed)
        out, err = resumed.communicate(timeout=120)
        assert resumed.returncode == 0, err
        thread.join(120)
        assert not thread.is_alive() and not errors, errors
        trainer.close()
        ids = [r.rollout_id for r in svc.all_results(job_id)]
        assert len(ids) == INSTANCES * 2

        assert submit.returncode == 1 and "Traceback" not in submit_err, submit_err
        assert f"resume with `raas results {job_id} --follow --out {f2}`" in submit_err
        finish = raas("results", job_id, "--follow", "--out", str(f2), env=env)
        followers.append(finish)
        assert finish.wait(120) == 0, finish.stderr.read()

        assert 0 < killed_at < len(ids), "the gateway must die while the job runs"
        assert_every_rollout_once(streamed, ids, "SDK stream()")
        assert [r.seq for r in streamed] == list(range(1, len(ids) + 1))  # in order
        assert_every_rollout_once(rows_of(f1), ids, "raas results --follow (killed, resumed)")
        assert_every_rollout_once(rows_of(f2), ids, "raas submit --out, then results --follow")
        assert f1.read_text().endswith("\n") and "torn" not in f1.read_text()
    finally:
        for proc in followers:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        gateway.kill()
        svc.stop()
