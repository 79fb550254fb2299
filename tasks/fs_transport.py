"""The embedded broker: kombu's filesystem transport with atomic message files.

kombu writes a message file in place while consumers may already move it away: a consumer
that takes the file between `open()` and `write()` reads an empty or partial payload, fails to
decode it, and the message is lost (seen here under a few hundred rollouts per second). We
write under a name no consumer matches and rename it into place, which is atomic on POSIX.
"""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps
from kombu.exceptions import ChannelError
from time import monotonic


class Channel(filesystem.Channel):
    """Filesystem channel whose `_put` is atomic."""

    def _put(self, queue, payload, **kwargs):  # noqa: ANN001 - kombu's signature
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        staging = os.path.join(self.data_folder_out, f".staging-{uuid.uuid4().hex}")
        try:
            with open(staging, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(staging, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    """Filesystem transport using the atomic channel."""

    Channel = Channel

    @property
    def default_connection_params(self) -> dict:
        """No host: a folder needs none (kombu warns "No hostname was supplied" otherwise)."""
        return {"port": self.default_port, "hostname": None}


def sweep_stale_broadcasts(folder: str, max_age: float = 60.0) -> int:
    """Delete control broadcasts (e.g. `inspect`) that no worker took within `max_age`.

    The filesystem transport never forgets a worker's pidbox binding, so every broadcast
    also writes a message for each worker that ever died here; a live worker takes its own
    within a polling interval, so an old one is garbage. Returns how many were removed.
    """
    now, removed = time.time(), 0
    for path in Path(folder).glob("*.celery.pidbox.msg"):
        try:
            if now - path.stat().st_mtime > max_age:
                path.unlink()
                removed += 1
        except FileNotFoundError:  # a worker took it meanwhile
            continue
    return removed
