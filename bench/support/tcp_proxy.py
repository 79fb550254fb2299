"""A fault-injecting TCP proxy on the loopback interface, for tests that cut a link.

`LoopbackProxy(target_port)` listens on a free 127.0.0.1 port of its own and forwards every
connection to 127.0.0.1:target_port. The faults are what a network does to a client:

- `refuse()` / `heal()`: the listener closes and every open connection is reset, so a new
  connection is refused (ECONNREFUSED) and an open one fails mid-stream (a server restart);
  `refuse_for(seconds)` heals by a timer;
- `partition(direction)` / `heal()`: a network partition. Nothing is refused or reset: bytes
  in the cut direction ("up": client to server, "down": server to client, "both") are held,
  and a new connection is accepted but not carried further; `heal()` delivers what was held,
  late, as TCP does after a partition ends (the clients' own timeouts decide what they see);
- `delay = 0.15`: every chunk, each way, waits that long (0.3 s per round trip: a slow link);
- `reset_rate = 0.05`: each chunk resets its connection with that probability (a link that
  drops connections mid-transaction); `seed` makes the draws repeatable.

Traffic only ever reaches the target the test named, through the address this proxy made.
`forwarded` counts the connections carried, `resets` the connections reset on purpose.
`ProxyProcess` is the same proxy in a process of its own (for links that carry much).
"""

from __future__ import annotations

import multiprocessing
import random
import socket
import threading
import time
from multiprocessing.connection import Connection
from typing import Literal

Direction = Literal["up", "down", "both"]


class LoopbackProxy:
    """127.0.0.1:`port` -> 127.0.0.1:`target_port`, with faults on demand."""

    def __init__(self, target_port: int, seed: int = 0) -> None:
        self.target_port = target_port
        self.delay = 0.0
        self.reset_rate = 0.0
        self.forwarded = 0
        self.resets = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._listener: socket.socket | None = None
        self._probe: socket.socket | None = None
        # Set while bytes in that direction flow; cleared by a partition.
        self._open = {"up": threading.Event(), "down": threading.Event()}
        for event in self._open.values():
            event.set()
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
        for link in links:
            link.kill()
        # A bound socket that does not listen holds the port (nobody else takes it meanwhile)
        # while the kernel refuses connections to it.
        self._probe = socket.socket()
        self._probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._probe.bind(("127.0.0.1", self.port))

    def partition(self, direction: Direction = "both") -> None:
        """Hold every byte in `direction` (and, for "up" or "both", new connections) until
        `heal()`."""
        for side in ("up", "down") if direction == "both" else (direction,):
            self._open[side].clear()

    def heal(self) -> None:
        """End a refusal or a partition: listen again, deliver what was held."""
        probe, self._probe = self._probe, None
        if probe is not None:
            probe.close()
            self._listen(self.port)
        for event in self._open.values():
            event.set()

    def refuse_for(self, seconds: float) -> threading.Timer:
        """`refuse()` now and `heal()` after `seconds` (the timer is returned, started)."""
        self.refuse()
        return self._heal_after(seconds)

    def partition_for(self, seconds: float, direction: Direction = "both") -> threading.Timer:
        """`partition(direction)` now and `heal()` after `seconds` (the timer, started)."""
        self.partition(direction)
        return self._heal_after(seconds)

    def close(self) -> None:
        """Stop forwarding for good."""
        self.heal()
        self.refuse()
        if self._probe is not None:
            self._probe.close()
            self._probe = None

    def _heal_after(self, seconds: float) -> threading.Timer:
        timer = threading.Timer(seconds, self.heal)
        timer.daemon = True
        timer.start()
        return timer

    # -- forwarding ---------------------------------------------------------------------------
    def _listen(self, port: int) -> int:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(512)
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
            threading.Thread(target=self._carry, args=(listener, client), daemon=True).start()

    def _carry(self, listener: socket.socket, client: socket.socket) -> None:
        """Connect `client` upstream (once the link is up) and pipe both ways."""
        self._open["up"].wait()  # a partitioned link: the SYN got here, nothing further
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
        except OSError:
            _reset(client)
            return
        upstream.settimeout(None)
        link = _Link(client, upstream)
        with self._lock:
            refused = self._listener is not listener  # refused meanwhile
            if not refused:
                self._links.add(link)
                self.forwarded += 1
        if refused:
            _reset(client)
            _reset(upstream)
            return
        threading.Thread(target=self._pipe, args=(link, client, upstream, "up"), daemon=True).start()
        self._pipe(link, upstream, client, "down")

    def _pipe(self, link: _Link, src: socket.socket, dst: socket.socket, side: str) -> None:
        try:
            while data := src.recv(65536):
                self._open[side].wait()
                if self.delay:
                    time.sleep(self.delay)
                if self.reset_rate and self._draw() < self.reset_rate:
                    self.resets += 1
                    break
                dst.sendall(data)
        except OSError:
            pass
        link.kill()  # the other direction's recv wakes up too
        if link.done():
            with self._lock:
                self._links.discard(link)

    def _draw(self) -> float:
        with self._lock:
            return self._rng.random()


class _Link:
    """One carried connection: its two sockets, closed once both pipes stopped using them.

    A socket is never closed while another thread may still block in `recv` on it: on Linux
    that `recv` would not wake, and the descriptor, once reused by a new connection, would be
    read by the stale thread. `kill` shuts both down (every `recv` returns) with SO_LINGER 0,
    so the final close resets the connection as a dead link does."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.socks = (client, upstream)
        self._pipes = 2
        self._lock = threading.Lock()

    def kill(self) -> None:
        """Wake both pipes; the connection ends with a reset."""
        for sock in self.socks:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_0)
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def done(self) -> bool:
        """A pipe ended; the last one closes both sockets (True then)."""
        with self._lock:
            self._pipes -= 1
            last = self._pipes == 0
        if last:
            for sock in self.socks:
                sock.close()
        return last


_LINGER_0 = b"\x01\x00\x00\x00\x00\x00\x00\x00"  # struct linger {on, 0 s}: close sends RST


def _reset(sock: socket.socket) -> None:
    """Close `sock` with a TCP reset (SO_LINGER 0), as a link that died would."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_0)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class ProxyProcess:
    """A `LoopbackProxy` in a process of its own, driven from this one (same faults, same
    counters). A campaign's links carry every byte two nodes exchange with PostgreSQL and
    Redis: forwarded by threads of the test process, they competed for its GIL with the
    gateway and the reapers that run there, and a loaded machine's first submission took
    longer than the client's timeout."""

    def __init__(self, target_port: int, seed: int = 0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, target_port, seed), daemon=True, name="tcp-proxy")
        self._proc.start()
        self._lock = threading.Lock()
        self.port: int = self._conn.recv()

    def _ask(self, op: str, *args: object) -> object:
        with self._lock:
            self._conn.send((op, args))
            return self._conn.recv()

    def refuse(self) -> None:
        """See `LoopbackProxy.refuse`."""
        self._ask("refuse")

    def partition(self, direction: Direction = "both") -> None:
        """See `LoopbackProxy.partition`."""
        self._ask("partition", direction)

    def heal(self) -> None:
        """See `LoopbackProxy.heal`."""
        self._ask("heal")

    def refuse_for(self, seconds: float) -> None:
        """See `LoopbackProxy.refuse_for` (the timer runs in the proxy's process)."""
        self._ask("refuse_for", seconds)

    def partition_for(self, seconds: float, direction: Direction = "both") -> None:
        """See `LoopbackProxy.partition_for`."""
        self._ask("partition_for", seconds, direction)

    @property
    def delay(self) -> float:
        return self._ask("get", "delay")  # type: ignore[return-value]

    @delay.setter
    def delay(self, value: float) -> None:
        self._ask("set", "delay", value)

    @property
    def reset_rate(self) -> float:
        return self._ask("get", "reset_rate")  # type: ignore[return-value]

    @reset_rate.setter
    def reset_rate(self, value: float) -> None:
        self._ask("set", "reset_rate", value)

    @property
    def resets(self) -> int:
        return self._ask("get", "resets")  # type: ignore[return-value]

    @property
    def forwarded(self) -> int:
        return self._ask("get", "forwarded")  # type: ignore[return-value]

    def close(self) -> None:
        """Stop forwarding and end the process."""
        if self._proc.is_alive():
            try:
                self._ask("close")
            except (EOFError, OSError):
                pass
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()


def _serve(conn: Connection, target_port: int, seed: int) -> None:
    """The proxy process: a LoopbackProxy answering its owner's calls until told to close."""
    proxy = LoopbackProxy(target_port, seed)
    conn.send(proxy.port)
    while True:
        try:
            op, args = conn.recv()
        except (EOFError, OSError):  # the owner is gone
            proxy.close()
            return
        if op == "get":
            conn.send(getattr(proxy, args[0]))
        elif op == "set":
            setattr(proxy, *args)
            conn.send(None)
        else:
            getattr(proxy, op)(*args)
            conn.send(None)
            if op == "close":
                return
