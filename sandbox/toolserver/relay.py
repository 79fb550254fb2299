"""Loopback TCP -> Unix socket relay, run inside a sandbox (standalone: stdlib only, by path).

`python3 -I -S relay.py --socket PATH [--port 0]` listens on 127.0.0.1:PORT of the sandbox's
own network namespace, prints the port, detaches into the background and copies bytes both
ways between each accepted connection and a fresh connection to the Unix socket PATH (the
host's per-rollout model endpoint, bound read-only into the sandbox). An unmodified harness
is configured with `http://127.0.0.1:PORT/v1`; with the network off this loopback port is the
only thing it can reach, and the socket reaches only its own rollout's endpoint.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading

CHUNK = 1 << 16


def pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy src -> dst until EOF, then half-close dst so the peer sees the end too."""
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def serve_one(client: socket.socket, path: str) -> None:
    """Bridge one accepted TCP connection to a new connection on the Unix socket."""
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def serve(listener: socket.socket, path: str) -> None:
    """Accept forever; one thread per connection (a harness keeps a few open at most)."""
    while True:
        client, _ = listener.accept()
        threading.Thread(target=serve_one, args=(client, path), daemon=True).start()


def detach() -> None:
    """Fork into the background in a session of its own; the parent exits after the print."""
    if os.fork():
        os._exit(0)
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)


def main(argv: list[str] | None = None) -> None:
    """Bind, print the port, detach, relay."""
    parser = argparse.ArgumentParser(prog="relay")
    parser.add_argument("--socket", required=True, help="the endpoint's Unix socket")
    parser.add_argument("--port", type=int, default=0, help="loopback port (0: any free one)")
    parser.add_argument("--foreground", action="store_true", help="do not detach")
    args = parser.parse_args(argv)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", args.port))
    listener.listen(64)
    sys.stdout.write(f"{listener.getsockname()[1]}\n")
    sys.stdout.flush()
    if not args.foreground:
        detach()
    serve(listener, args.socket)


if __name__ == "__main__":
    main()
