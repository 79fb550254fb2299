"""The newcomer's path: `raas up` on the embedded default, `raas submit --wait --out`, Ctrl-C."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from raas_client import RaasClient
from bench.support.waiting import wait_for

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_up_submit_stream_groups_prorl_and_ctrl_c(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAAS_")}
    env.update(PYTHONPATH=str(REPO), RAAS_HANDLER_MODULES="bench.support.pipeline_handlers")
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.ops.cli",
            "up",
            "--home",
            str(tmp_path / "home"),
            "--port",
            str(port),
            "--concurrency",
            "2",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=default_sigint,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        assert (tmp_path / "home" / "raas.db").exists()  # migrations ran on start
        assert len(processes_with_env(f"RAAS_HOME={tmp_path / 'home'}")) >= 3
        data = tmp_path / "batch.jsonl"
        data.write_text("\n".join(json.dumps({"instance_id": f"p{k}", "k": k}) for k in range(4)))
        out = tmp_path / "out.jsonl"
        submit = subprocess.run(
            [
                sys.executable,
                "-m",
                "app.ops.cli",
                "submit",
                str(data),
                "--agent",
                "test-sleepy",
                "--n",
                "2",
                "--url",
                url,
                "--wait",
                "--out",
                str(out),
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert submit.returncode == 0, submit.stderr
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        ui_url = f"{url}/ui/jobs/{rows[0]['job_id']}"
        assert ui_url in submit.stdout  # `raas submit` prints the job's dashboard page
        page = httpx.get(ui_url, timeout=30)
        assert page.status_code == 200 and 'id="groups"' in page.text
        assert len(rows) == 8 and {r["outcome"] for r in rows} == {"completed"}
        assert {
            "rollout_id",
            "job_id",
            "instance_id",
            "sample_index",
            "node",
            "reward",
            "prompt_ids",
            "response_ids",
            "response_logprobs",
            "loss_mask",
            "timing",
        } <= set(rows[0])
        with RaasClient(url) as client:
            job = client.submit("test-sleepy", [{"instance_id": f"g{k}"} for k in range(3)], n_samples=2)
            groups = list(client.groups(job.job_id))
            assert sorted(g[0].instance_id for g in groups) == ["g0", "g1", "g2"]
            assert all([r.sample_index for r in g] == [0, 1] for g in groups)
            streamed = list(client.stream(job.job_id))
            assert [r.seq for r in streamed] == [1, 2, 3, 4, 5, 6]
        assert httpx.post(f"{url}/start", timeout=10).status_code == 200  # ProRL's lifecycle
        prorl = httpx.post(
            f"{url}/process",
            timeout=60,
            json={
                "instance": {"instance_id": "pr1", "data_source": "test-sleepy", "trajectory_id": 3},
                "sampling_params": {"temperature": 0.7, "max_new_tokens": 64},
                "job_id": "grp",
            },
        )
        assert prorl.status_code == 200, prorl.text
        body = prorl.json()
        assert body["success"] and body["end_properly"] and body["critical_error"] is None
        assert body["filter"] is False and body["finish"] is False
        assert body["instance_id"] == "pr1" and body["trajectory_id"] == 3
        assert set(body["timing"]) == {
            "init_time",
            "run_time",
            "eval_time",
            "others_time",
            "counted_elapsed",
            "timeout_triggered",
        }
        # this test handler's trajectory has no assistant message: ProRL's list is then empty
        assert body["messages"] == [] and body["prompt_ids"] == [1, 2, 3]
    finally:
        output = ctrl_c(up)
    assert up.returncode == 0, output[-3000:]
    assert not processes_with_env(f"RAAS_HOME={tmp_path / 'home'}"), "workers survived Ctrl-C"
    assert not redis_answers(tmp_path / "home"), "Ctrl-C left the embedded Redis running"


def redis_answers(home: Path) -> bool:
    """Whether the home's embedded Redis still answers (`raas up` stops it at exit)."""
    from core.settings import embedded_redis_socket
    from tasks.broker.embedded_redis import answers

    return answers(embedded_redis_socket(home))


def default_sigint() -> None:
    """In the child: Ctrl-C's default action, even if this test runs with SIGINT ignored
    (a parent launched in the background passes that on)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ctrl_c(up: subprocess.Popen, grace: float = 60) -> str:
    """Ctrl-C to the process group of `raas up`; SIGKILL it if it does not stop (never leak)."""
    os.killpg(up.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
    try:
        return up.communicate(timeout=grace)[0].decode(errors="replace")
    except subprocess.TimeoutExpired:
        exited = up.poll()  # not None: it exited, but something it started holds its output open
        with contextlib.suppress(ProcessLookupError):  # none of its group is left
            os.killpg(up.pid, signal.SIGKILL)
        output = up.communicate()[0].decode(errors="replace")
        raise AssertionError(f"raas up did not stop on Ctrl-C (exit code {exited}):\n{output[-3000:]}") from None


def processes_with_env(entry: str) -> list[int]:
    """Pids whose environment holds `entry` (the stage pools `raas up` spawned)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and entry.encode() in (proc / "environ").read_bytes().split(b"\0"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_up_on_a_busy_port_fails_without_leaving_workers(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAAS_")}
        env["PYTHONPATH"] = str(REPO)
        home = tmp_path / "home"
        up = subprocess.run(
            [sys.executable, "-m", "app.ops.cli", "up", "--home", str(home), "--port", str(port)],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert up.returncode != 0 and "Address already in use" in up.stderr
    assert not processes_with_env(f"RAAS_HOME={home}")
    assert not redis_answers(home)


def test_up_stops_cleanly_on_sigterm(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAAS_")}
    env["PYTHONPATH"] = str(REPO)
    home = tmp_path / "home"
    up = subprocess.Popen(
        [sys.executable, "-m", "app.ops.cli", "up", "--home", str(home), "--port", str(port)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while len(processes_with_env(f"RAAS_HOME={home}")) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    up.send_signal(signal.SIGTERM)  # only the parent: it must take its pools down itself
    try:
        assert up.wait(60) == 0
    finally:
        if up.poll() is None:
            up.kill()
    assert not processes_with_env(f"RAAS_HOME={home}")
    assert not redis_answers(home)


def stage_pids(home: Path, stage: str) -> list[int]:
    """Pids of `raas up`'s pool for one stage."""
    return [
        pid
        for pid in processes_with_env(f"RAAS_HOME={home}")
        if f"--stage\0{stage}\0".encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


def ready(url: str) -> tuple[int, dict]:
    try:
        resp = httpx.get(f"{url}/readyz", timeout=10)
        return resp.status_code, resp.json()
    except httpx.TransportError:
        return 0, {}


def wait_until(predicate, timeout: float, what: str):
    return wait_for(predicate, timeout, what, interval=0.3)


def test_up_restarts_a_killed_pool_and_ctrl_c_stops_its_sandboxes(tmp_path):
    from sandbox import list_sandboxes
    from sandbox.handles import unclaimed

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAAS_")}
    env.update(PYTHONPATH=str(REPO), RAAS_HANDLER_MODULES="bench.support.pipeline_handlers")
    home = tmp_path / "home"
    up = subprocess.Popen(
        [sys.executable, "-m", "app.ops.cli", "up", "--home", str(home), "--port", str(port), "--concurrency", "2"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=default_sigint,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        status, body = wait_until(lambda: (lambda r: r if r[0] == 200 else None)(ready(url)), 90, "readyz 200")
        node = next(q.split(".", 1)[1] for q in body["stages"] if q.startswith("run."))
        assert body["stages"] == {"init": 1, f"run.{node}": 1, f"eval.{node}": 1}
        [run_pid] = stage_pids(home, "run")
        os.kill(run_pid, signal.SIGSTOP)  # hung: alive for the supervisor, silent to readyz
        status, body = wait_until(
            lambda: (lambda r: r if r[0] == 503 else None)(ready(url)),
            30,
            "readyz 503 while the RUN pool does not answer",
        )
        assert body["stages"][f"run.{node}"] == 0
        assert body["workers"] == f"error: no worker consumes run.{node}"
        os.kill(run_pid, signal.SIGKILL)
        wait_until(lambda: ready(url)[0] == 200, 60, "readyz 200 again")
        assert stage_pids(home, "run") and run_pid not in stage_pids(home, "run")
        with RaasClient(url) as client:
            job = client.submit("test-sandboxed", [{"instance_id": "s0"}], agent_config={"run_s": 60, "turns": 60})
            wait_until(lambda: client.job(job.job_id).counts.get("run"), 60, "RUN")
        root = str(home.resolve() / "workspaces") + "/"

        def mine() -> list[dict]:  # the rollout's and the INIT pool's warm ones alike
            return [h for h in list_sandboxes() if h.get("workspace", "").startswith(root)]

        assert len([h for h in mine() if not unclaimed(h)]) == 1
    finally:
        output = ctrl_c(up)
    assert up.returncode == 0, output[-3000:]
    assert f"RUN pool (pid {run_pid}) exited with signal SIGKILL after " in output  # the node supervisor's line
    # a quiet console: one line per component, no banners, no warnings nobody can act on
    assert output.count(" pool ready: queue ") == 4 and output.count("raas up: gateway ") == 1
    for noise in ("[config]", "SecurityWarning", "No hostname was supplied", "alembic", "GET /readyz", "celery.worker"):
        assert noise not in output, noise
    assert not mine(), "Ctrl-C left a sandbox running"
    assert not processes_with_env(f"RAAS_HOME={home}")


def test_kill_9_of_the_service_and_its_broker_mid_job_loses_nothing(tmp_path):
    """`raas up`, its pools and its Redis server all killed hard while most of a job waits in
    the broker; a new `raas up` on the same home takes the queue back from the append-only
    file (and the reaper what the dead pools held) and every rollout ends completed, once."""
    from core.settings import Settings, embedded_redis_socket
    from tasks.broker.embedded_redis import answers, stop

    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAAS_")}
    env.update(
        PYTHONPATH=str(REPO),
        RAAS_HANDLER_MODULES="bench.support.pipeline_handlers",
        RAAS_HEARTBEAT_INTERVAL="0.5",
        RAAS_LEASE_TIMEOUT="4",
        RAAS_REQUEUE_AFTER="3",
        RAAS_REAPER_INTERVAL="0.5",
        RAAS_STAGE_GRACE="2",
    )

    settings = Settings(home=home)
    launched: list[subprocess.Popen] = []

    def start() -> str:
        port = free_port()
        launched.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "app.ops.cli",
                    "up",
                    "--home",
                    str(home),
                    "--port",
                    str(port),
                    "--concurrency",
                    "2",
                ],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=default_sigint,
            )
        )
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: ready(url)[0] == 200, 90, "readyz 200")
        return url

    try:
        url = start()
        with RaasClient(url) as client:
            job = client.submit(
                "test-sleepy",
                [{"instance_id": f"k{k}"} for k in range(10)],
                n_samples=2,
                agent_config={"init_s": 0.2, "run_s": 1.0, "turns": 4},
            )
            wait_until(lambda: client.job(job.job_id).finished >= 2, 120, "2 rollouts done")
        # the gateway and the reaper, then the pools (each in its own session; stopped first,
        # `raas up` cannot start new ones, nor is its parent-death signal a drain they see)
        os.kill(launched[0].pid, signal.SIGSTOP)
        for pid in [pid for stage in ("init", "run", "eval") for pid in stage_pids(home, stage)]:
            os.kill(pid, signal.SIGKILL)
        os.killpg(launched[0].pid, signal.SIGKILL)
        launched[0].communicate()
        pid = int((settings.redis_dir / "redis.pid").read_text())
        os.kill(pid, signal.SIGKILL)  # ... and the broker (its own session: a daemon)
        wait_until(lambda: not Path(f"/proc/{pid}/cwd").exists(), 10, "Redis gone")
        assert not answers(embedded_redis_socket(home))
        url = start()
        with RaasClient(url) as client:
            wait_until(lambda: client.job(job.job_id).finished >= 20, 180, "the job done")
            rows = list(client.results(job.job_id, wait=1))
    finally:
        output = ctrl_c(launched[-1]) if launched[-1].poll() is None else ""
        left_running = answers(embedded_redis_socket(home))
        stop(settings)  # whatever the test's outcome: no server outlives it
    assert launched[-1].returncode == 0, output[-3000:]
    assert len(rows) == 20 and len({r.rollout_id for r in rows}) == 20
    assert {r.outcome for r in rows} == {"completed"}
    assert sorted(r.reward for r in rows) == [0.0] * 10 + [1.0] * 10  # graded, really
    assert all(r.response_ids == [4, 5] for r in rows)
    assert not left_running, "raas up left its Redis running"
