"""A fault-injecting TCP proxy on the loopback interface, for tests that cut a link.

`LoopbackProxy(target_port)` listens on a free 127.0.0.1 port of its own and forwards every
connection to 127.0.0.1:target_port. The faults are what a network does to a client:

- `refuse()`: the listener closes and every open connection is reset, so a new connection is
  refused (ECONNREFUSED) and an open one fails mid-stream; `heal()` listens again on the
  same port;
- `refuse_for(seconds)`: the same, healed by a timer;
- `delay = 0.3`: every chunk waits that long before it is forwarded (a slow link).

Traffic only ever reaches the target the test named, through the address this proxy made.
`forwarded` counts the connections it carried.
"""

from __future__ import annotations

import socket
import threading
import time


class LoopbackProxy:
    """127.0.0.1:`port` -> 127.0.0.1:`target_port`, with faults on demand."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.delay = 0.0
        self.forwarded = 0
        self._lock = threading.Lock()
        self._links: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._probe: socket.socket | None = None
        self.port = self._listen(0)

    # -- faults -----------------------------------------------------------------------------
    def refuse(self) -> None:
        """Close the listener and reset every open connection: new connections are refused."""
        with self._lock:
            listener, self._listener = self._listener, None
            links, self._links = list(self._links), set()
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)  # wakes its accept() (close alone does not)
            except OSError:
                pass
            listener.close()
        for sock in links:
            _reset(sock)
        # A bound socket that does not listen holds the port (nobody else takes it meanwhile)
        # while the kernel refuses connections to it.
        self._probe = socket.socket()
        self._probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._probe.bind(("127.0.0.1", self.port))

    def heal(self) -> None:
        """Listen again on the same port."""
        probe, self._probe = self._probe, None
        if probe is not None:
            probe.close()
        self._listen(self.port)

    def refuse_for(self, seconds: float) -> threading.Timer:
        """`refuse()` now and `heal()` after `seconds` (the timer is returned, started)."""
        self.refuse()
        timer = threading.Timer(seconds, self.heal)
        timer.daemon = True
        timer.start()
        return timer

    def close(self) -> None:
        """Stop forwarding for good."""
        self.refuse()
        if self._probe is not None:
            self._probe.close()
            self._probe = None

    # -- forwarding ---------------------------------------------------------------------------
    def _listen(self, port: int) -> int:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        with self._lock:
            self._listener = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()
        return sock.getsockname()[1]

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # the listener closed (refuse)
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                _reset(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                refused = self._listener is not listener  # refused meanwhile
                if not refused:
                    self._links.update((client, upstream))
                    self.forwarded += 1
            if refused:
                _reset(client)
                _reset(upstream)
                return
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self.delay:
                    time.sleep(self.delay)
                dst.sendall(data)
        except OSError:
            pass
        with self._lock:
            self._links.discard(src)
            self._links.discard(dst)
        _reset(dst)


def _reset(sock: socket.socket) -> None:
    """Close `sock` with a TCP reset (SO_LINGER 0), as a link that died would."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
