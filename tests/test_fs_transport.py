"""The embedded broker: never a half-written message, each message to exactly one consumer,
in order, and polls that do not list a whole backlog."""
from __future__ import annotations

import json
import os
import threading

from kombu import Connection

from tasks.fs_transport import Transport, queue_folder


def test_consumers_never_see_partial_messages(tmp_path):
    folder = str(tmp_path)
    conn = Connection(transport=Transport, transport_options={
        "data_folder_in": folder, "data_folder_out": folder, "control_folder": folder})
    channel = conn.default_channel
    payload = {"body": "x" * 200_000}
    stop = threading.Event()
    torn: list[str] = []

    def watch() -> None:  # what a racing consumer would read
        qdir = queue_folder(folder, "q")
        while not stop.is_set():
            for name in os.listdir(qdir) if os.path.isdir(qdir) else []:
                if name.endswith(".msg"):
                    try:
                        with open(os.path.join(qdir, name), "rb") as f:
                            json.loads(f.read())
                    except FileNotFoundError:
                        continue
                    except ValueError:
                        torn.append(name)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _ in range(300):
            channel._put("q", payload)
    finally:
        stop.set()
        watcher.join()
    assert torn == []
    got = 0
    while True:
        try:
            assert channel._get("q") == payload
            got += 1
        except Exception:
            break
    assert got == 300
    conn.release()


def _channel(folder: str):
    conn = Connection(transport=Transport, transport_options={
        "data_folder_in": folder, "data_folder_out": folder, "control_folder": folder})
    return conn, conn.default_channel


def _take_all(channel, queue: str) -> list:
    from kombu.transport.virtual import Empty

    got = []
    while True:
        try:
            got.append(channel._get(queue))
        except Empty:
            return got


def test_two_consumers_share_a_backlog_each_message_once_in_order(tmp_path):
    """Cached listings go stale when another consumer takes messages: nothing is delivered
    twice, nothing is skipped, and each consumer sees publication order."""
    folder = str(tmp_path)
    conn_p, producer = _channel(folder)
    for i in range(600):
        producer._put("init", {"i": i})
    conns, channels = zip(*[_channel(folder) for _ in range(2)])
    seen: list[list[int]] = [[], []]
    barrier = threading.Barrier(2)

    def consume(k: int) -> None:
        barrier.wait()
        seen[k] = [m["i"] for m in _take_all(channels[k], "init")]

    threads = [threading.Thread(target=consume, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen[0] + seen[1]) == list(range(600))
    assert all(s == sorted(s) for s in seen)
    assert channels[0]._size("init") == 0
    for c in (conn_p, *conns):
        c.release()


def test_messages_published_after_a_listing_still_arrive_and_queues_stay_apart(tmp_path):
    folder = str(tmp_path)
    conn, channel = _channel(folder)
    for i in range(3):
        channel._put("init", {"i": i})
    channel._put("run.node-a", {"run": 1})
    assert channel._get("init") == {"i": 0}  # the consumer now holds a listing of init
    channel._put("init", {"i": 3})
    assert [m["i"] for m in _take_all(channel, "init")] == [1, 2, 3]
    assert channel._size("run.node-a") == 1 and channel._purge("run.node-a") == 1
    assert _take_all(channel, "run.node-a") == []
    conn.release()


def test_stale_broadcasts_are_swept_fresh_ones_and_tasks_stay(tmp_path):
    """A dead worker's pidbox messages go after max_age; queued stage messages never do."""
    import os
    import time

    from tasks.fs_transport import sweep_stale_broadcasts

    def message(queue: str, name: str):
        path = tmp_path / "q" / queue / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
        return path

    old = message("run@node-a-1.celery.pidbox", "1_a.msg")
    fresh = message("run@node-a-2.celery.pidbox", "2_b.msg")
    task = message("init", "3_c.msg")
    past = time.time() - 120
    for path in (old, task):
        os.utime(path, (past, past))
    assert sweep_stale_broadcasts(str(tmp_path), max_age=60) == 1
    assert not old.exists() and fresh.exists() and task.exists()
