"""The embedded broker never exposes a half-written message file to consumers."""
from __future__ import annotations

import json
import os
import threading

from kombu import Connection

from tasks.fs_transport import Transport


def test_consumers_never_see_partial_messages(tmp_path):
    folder = str(tmp_path)
    conn = Connection(transport=Transport, transport_options={
        "data_folder_in": folder, "data_folder_out": folder, "control_folder": folder})
    channel = conn.default_channel
    payload = {"body": "x" * 200_000}
    stop = threading.Event()
    torn: list[str] = []

    def watch() -> None:  # what a racing consumer would read
        while not stop.is_set():
            for name in os.listdir(folder):
                if name.endswith(".q.msg"):
                    try:
                        with open(os.path.join(folder, name), "rb") as f:
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


def test_stale_broadcasts_are_swept_fresh_ones_and_tasks_stay(tmp_path):
    """A dead worker's pidbox messages go after max_age; queued stage messages never do."""
    import os
    import time

    from tasks.fs_transport import sweep_stale_broadcasts

    old = tmp_path / "1_a.run@node-a-1.celery.pidbox.msg"
    fresh = tmp_path / "2_b.run@node-a-2.celery.pidbox.msg"
    task = tmp_path / "3_c.init.msg"
    for path in (old, fresh, task):
        path.write_text("{}")
    past = time.time() - 120
    for path in (old, task):
        os.utime(path, (past, past))
    assert sweep_stale_broadcasts(str(tmp_path), max_age=60) == 1
    assert not old.exists() and fresh.exists() and task.exists()
