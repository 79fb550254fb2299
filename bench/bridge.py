"""The sandbox bridge's added latency per model call: loopback relay vs the socket directly.

Inside a real bwrap sandbox (network off), a client makes N small HTTP keep-alive calls to a
host HTTP server on the sandbox's endpoint socket, once through the relay
(`http://127.0.0.1:PORT`, what a harness uses) and once straight to the Unix socket (the
baseline: same client, same server, no relay). The relay's added latency is the difference of
the medians (each the median over interleaved rounds); the endpoint's own overhead over the
inference server is h-endpoint's figure.
Prints JSON + a table.

    .venv/bin/python bench/bridge.py [--calls 500]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
from http.server import BaseHTTPRequestHandler
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sandbox import SandboxSpec, bridge, get_runtime  # noqa: E402
from bench.support.endpoint_server import serve_endpoint  # noqa: E402

# Runs inside the sandbox with the system python: one keep-alive connection, N timed calls.
CLIENT = r"""
import http.client, json, socket, statistics, sys, time
mode, target, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
class UnixConnection(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect(target)
conn = UnixConnection("x") if mode == "unix" else http.client.HTTPConnection("127.0.0.1", int(target))
body = json.dumps({"messages": [{"role": "user", "content": "x" * 2000}]})
times = []
for i in range(n + 20):
    t = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    conn.getresponse().read()
    if i >= 20:
        times.append((time.perf_counter() - t) * 1000)
times.sort()
print(json.dumps({"p50_ms": statistics.median(times), "p90_ms": times[int(0.9 * len(times))]}))
"""


class _Reply(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDKs use it

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"choices": [{"message": {"role": "assistant", "content": "ok"}}]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    """Start a sandbox with an endpoint folder, serve, time both paths, print."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raas-bb-", dir="/tmp") as tmp:
        os.mkdir(f"{tmp}/ws")
        sb = get_runtime("bwrap", state_dir=f"{tmp}/st").start(
            SandboxSpec(workspace=f"{tmp}/ws", model_endpoint=True), label="bench:0"
        )
        try:
            server = serve_endpoint(sb, _Reply)
            port = bridge.start_relay(sb)
            inside = sb.handle["endpoint_inside"]
            runs: dict[str, list[dict]] = {"unix": [], "relay": []}
            for _ in range(args.rounds):  # interleaved: the shared machine's noise hits both
                for mode, target in (("unix", inside), ("relay", str(port))):
                    out = sb.bash(f"python3 -c {shlex.quote(CLIENT)} {mode} {target} {args.calls}", timeout=600).output
                    runs[mode].append(json.loads(out.strip().splitlines()[-1]))
            server.shutdown()
            rows = {
                mode: {key: statistics.median(r[key] for r in found) for key in ("p50_ms", "p90_ms")}
                for mode, found in runs.items()
            }
        finally:
            sb.stop()
    added = rows["relay"]["p50_ms"] - rows["unix"]["p50_ms"]
    result = {
        "calls": args.calls,
        "rounds": args.rounds,
        "direct_unix": rows["unix"],
        "through_relay": rows["relay"],
        "relay_added_p50_ms": round(added, 3),
        "ratio_p50": round(rows["relay"]["p50_ms"] / rows["unix"]["p50_ms"], 2),
    }
    print(json.dumps(result))
    print(
        f"| path | p50 ms | p90 ms |\n| --- | --- | --- |\n"
        f"| straight to the endpoint socket (baseline) | {rows['unix']['p50_ms']:.3f} | "
        f"{rows['unix']['p90_ms']:.3f} |\n| loopback relay (what a harness uses) | "
        f"{rows['relay']['p50_ms']:.3f} | {rows['relay']['p90_ms']:.3f} |\n"
        f"relay adds {added:.3f} ms p50 (x{result['ratio_p50']})"
    )


if __name__ == "__main__":
    main()
