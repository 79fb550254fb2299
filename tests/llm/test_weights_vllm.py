"""Verified weight pushes against a real CPU vLLM serving SmolLM2-135M-Instruct in fp32.

Real tier (`make test-vllm`, marker `vllm`). The fixture starts the server itself from
`VLLM_VENV` (default `.venv-vllm`) with `VLLM_SERVER_DEV_MODE=1 --dtype float32` and
a fixed `--served-model-name`, on a free port, serving an untied fp32 copy of
`SMOLLM_DIR` (default `models/smollm2-135m-instruct`) made by
`scripts/untie_checkpoint.py`. The trainer's side (the perturbed "trained" checkpoint and the
probe fingerprints) runs in `RAAS_TORCH_PYTHON` (default the python of `CONVERT_VENV`,
`.venv-convert`: torch 2.13 + transformers, made by `scripts/build_smollm2.sh`); see
tests/local_models.py. To reuse a server already running, set `RAAS_WEIGHTS_VLLM_URL` and
`RAAS_WEIGHTS_VLLM_MODEL` (the untied folder it serves). Figures are printed as JSON lines
(`-s` shows them): pause, load and verify seconds, max |Δ logprob|.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from raas_client import RaasHTTPError
from raas_client.weight_models import WeightPushReport
from raas_client.weights import TiedCheckpoint

from agents.llm.weights import Fingerprint, apply_weights, reset_prefix_cache, verify
from tests.local_models import CONVERT_VENV, SMOLLM_DIR, VLLM_VENV, torch_python
from bench.support.pipeline_harness import start_service, Service
from bench.support.private_services import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3600)]  # a vLLM start + torch runs

REPO = Path(__file__).resolve().parents[2]
TORCH_PYTHON = torch_python(CONVERT_VENV)
SMOLLM2 = SMOLLM_DIR
SERVED = "smollm2-untied"  # fixed: a reload never changes what requests must name
READY_SECONDS = 900  # ~2 min idle; much more on a loaded 2-core machine


def trainer(*args: str) -> str:
    """Run a trainer-side script with torch; its stdout."""
    done = subprocess.run([TORCH_PYTHON, *args], cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """v0 (what the server starts with) and v1 (v0 + seeded noise: a "training step"), both
    untied fp32, with the trainer's probe fingerprint of each."""
    root = tmp_path_factory.mktemp("weights")
    v0 = Path(os.environ.get("RAAS_WEIGHTS_VLLM_MODEL") or root / "v0")
    if not (v0 / "model.safetensors").exists():
        trainer("scripts/untie_checkpoint.py", str(SMOLLM2), str(v0))
    v1 = root / "v1"
    trainer("scripts/untie_checkpoint.py", str(v0), str(v1), "--perturb", "0.002", "--seed", "1")
    for name, folder in (("v0", v0), ("v1", v1)):
        trainer("scripts/trainer_probe.py", str(folder), str(root / f"probe-{name}.json"))
    return {"v0": v0, "v1": v1, "probe-v0": root / "probe-v0.json", "probe-v1": root / "probe-v1.json"}


def start_vllm(model: Path, dtype: str, logs: Path):
    """Start a CPU vLLM in dev mode serving `model` in `dtype`; (url, process) once healthy."""
    port = free_port()
    log = open(logs / f"vllm-{dtype}.log", "wb")
    env = {
        **os.environ,
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
    }
    proc = subprocess.Popen(
        [
            str(VLLM_VENV / "bin" / "python"),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--served-model-name",
            SERVED,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-model-len",
            "2048",
            "--dtype",
            dtype,
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=2).is_success:
                return url, proc
        except httpx.HTTPError:
            time.sleep(2)
    proc.kill()
    pytest.fail(f"vLLM did not start (exit {proc.poll()}); see {log.name}")


def stop_vllm(proc: subprocess.Popen) -> None:
    """Stop a server `start_vllm` started."""
    proc.terminate()
    proc.wait(60)


@pytest.fixture(scope="module")
def vllm_url(checkpoints, tmp_path_factory):
    """A CPU vLLM in dev mode serving v0 in fp32 (started here unless one is given)."""
    if os.environ.get("RAAS_WEIGHTS_VLLM_URL"):
        yield os.environ["RAAS_WEIGHTS_VLLM_URL"].rstrip("/")
        return
    url, proc = start_vllm(checkpoints["v0"], "float32", tmp_path_factory.mktemp("vllm"))
    yield url
    stop_vllm(proc)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, vllm_url) -> Iterator[Service]:
    """A raas service (gateway, workers, reaper) with the server registered as its pool."""
    svc = start_service(tmp_path_factory.mktemp("gateway"), concurrency={"init": 2, "run": 4, "eval": 2})
    svc.client.add_llm_server(vllm_url, model=SERVED, weight_version="v0")
    yield svc
    svc.stop()


def gateway_server(gateway) -> str:
    """The registered server's url."""
    return gateway.client.llm_servers()[0].url


def figures(report: WeightPushReport) -> dict:
    """The push's measured figures, printed for the record."""
    [s] = report.servers
    out = {
        "version": report.version,
        "pause_s": s.pause_seconds,
        "load_s": s.load_seconds,
        "verify_s": s.verify_seconds,
        "total_s": s.total_seconds,
        "max_abs_dlogp": s.check.max_abs_diff if s.check is not None else None,
        "before_max_abs_dlogp": s.before_max_abs_diff,
    }
    print(json.dumps(out))
    return out


def test_a_push_makes_the_served_logprobs_the_trainers(gateway, checkpoints) -> None:
    client = gateway.client
    for version in ("v1", "v0"):  # a step, then back: both directions verified
        probe = json.loads(checkpoints[f"probe-{version}"].read_text())
        report = client.push_weights(str(checkpoints[version]), version, probe, timeout=60)
        got = figures(report)
        assert report.resumed and got["max_abs_dlogp"] <= 1e-3  # fp32: < 1e-4 measured
        assert client.llm_servers()[0].weight_version == version
    probe_v1 = Fingerprint(**json.loads(checkpoints["probe-v1"].read_text()))
    on_v0 = verify(gateway_server(gateway), "vllm", SERVED, probe_v1, 1e-3)
    assert not on_v0.ok  # the two checkpoints are really different


def test_a_tied_checkpoint_is_refused(gateway, checkpoints) -> None:
    client = gateway.client
    probe = json.loads(checkpoints["probe-v1"].read_text())
    assert json.loads((SMOLLM2 / "config.json").read_text())["tie_word_embeddings"]
    with pytest.raises(TiedCheckpoint, match="lm_head"):
        client.push_weights(str(SMOLLM2), "tied", probe)
    with pytest.raises(RaasHTTPError) as refused:
        client._call("POST", "/v1/weights/push", json={"version": "tied", "path": str(SMOLLM2), "probe": probe})
    assert refused.value.status == 422 and "tie_word_embeddings" in refused.value.body["message"]
    assert not client.llm_servers()[0].paused


def test_skipping_the_prefix_cache_reset_is_caught(gateway, checkpoints) -> None:
    """The push's steps by hand, without the reset: the stale cache fails the verification."""
    url = gateway_server(gateway)
    probe = Fingerprint(**json.loads(checkpoints["probe-v1"].read_text()))
    try:
        reset_prefix_cache(url, "vllm")
        verify(url, "vllm", SERVED, probe, 1e-3)  # the old weights fill the cache
        apply_weights(url, "vllm", "reload", str(checkpoints["v1"]))
        stale = verify(url, "vllm", SERVED, probe, 1e-3)
        reset_prefix_cache(url, "vllm")
        fresh = verify(url, "vllm", SERVED, probe, 1e-3)
    finally:  # leave the server on v0, as registered
        apply_weights(url, "vllm", "reload", str(checkpoints["v0"]))
        reset_prefix_cache(url, "vllm")
    print(
        json.dumps(
            {
                "stale_max_abs_dlogp": stale.max_abs_diff,
                "stale_first_mismatch": stale.first_mismatch,
                "reset_max_abs_dlogp": fresh.max_abs_diff,
            }
        )
    )
    assert not stale.ok and fresh.ok and fresh.max_abs_diff <= 1e-3
    assert stale.first_mismatch is not None or stale.max_abs_diff > 1e-3


def test_a_push_mid_job_pauses_at_turn_boundaries_and_versions_every_turn(gateway, checkpoints) -> None:
    """Rollouts of the real model are mid-flight: the push waits for their generations (the
    measured pause), aborts none, and every turn records the version it was sampled with."""
    from tasks.llm.pool_pause import generating

    client = gateway.client
    url = gateway_server(gateway)
    job = client.submit(
        "test-chat",
        [{"instance_id": f"q{k}", "data": {}} for k in range(3)],
        n_samples=2,
        sampling={"max_tokens": 48, "temperature": 1.0},
        llm={"tokenizer": str(checkpoints["v0"]), "max_model_len": 2048},
        agent_config={"turns": 3, "observation_words": 10},
    )
    deadline = time.monotonic() + 600
    while not generating(gateway.settings.db_url, "default", [url], 30).get(url):
        assert time.monotonic() < deadline, gateway.log_tail()
        time.sleep(0.05)
    probe = json.loads(checkpoints["probe-v1"].read_text())
    report = client.push_weights(str(checkpoints["v1"]), "v1", probe, timeout=300)
    got = figures(report)
    [server] = report.servers
    print(json.dumps({"generating_at_pause": server.generating_at_pause}))
    assert report.resumed and server.generating_at_pause >= 1
    assert got["max_abs_dlogp"] <= 1e-3
    done = gateway.wait_done(job.job_id, timeout=900)
    assert set(done.outcomes) <= {"completed", "agent_error"}, done  # never infra/timeout
    details = [client.rollout(r.rollout_id) for r in gateway.all_results(job.job_id)]
    seen = set()
    for detail in details:
        versions = [t.weight_version for t in detail.turns]
        assert versions == sorted(versions)  # v0 turns, then v1 turns
        seen.update(versions)
    assert seen == {"v0", "v1"}
    # back to v0 for the other tests (verified too)
    probe_v0 = json.loads(checkpoints["probe-v0"].read_text())
    assert client.push_weights(str(checkpoints["v0"]), "v0", probe_v0, timeout=300).resumed


def test_a_tied_checkpoint_pushed_anyway_fails_the_verification(gateway, checkpoints, tmp_path_factory) -> None:
    """Trap 1 on the real server: `reload_weights` of a tied checkpoint leaves lm_head at the
    old weights, and the probe catches it (raas refuses it before this; done by hand here)."""
    root = tmp_path_factory.mktemp("tied")
    trainer(
        "scripts/untie_checkpoint.py",
        str(SMOLLM2),
        str(root / "tied"),
        "--perturb",
        "0.002",
        "--seed",
        "2",
        "--keep-tied",
    )
    trainer("scripts/trainer_probe.py", str(root / "tied"), str(root / "probe.json"))
    url = gateway_server(gateway)
    probe = Fingerprint(**json.loads((root / "probe.json").read_text()))
    try:
        apply_weights(url, "vllm", "reload", str(root / "tied"))
        reset_prefix_cache(url, "vllm")
        served = verify(url, "vllm", SERVED, probe, 1e-3)
    finally:
        apply_weights(url, "vllm", "reload", str(checkpoints["v0"]))
        reset_prefix_cache(url, "vllm")
    print(json.dumps({"tied_max_abs_dlogp": served.max_abs_diff, "tied_first_mismatch": served.first_mismatch}))
    assert not served.ok


def test_a_bf16_server_fails_the_verification_of_an_fp32_step(checkpoints, tmp_path_factory) -> None:
    """Trap 3 on the real server: a bf16 server rounds a small fp32 update away (and drifts
    from the fp32 trainer), so the pushed step does not verify; the same push to the fp32
    server does (test_a_push_makes_the_served_logprobs_the_trainers)."""
    url, proc = start_vllm(checkpoints["v0"], "bfloat16", tmp_path_factory.mktemp("bf16"))
    probe = Fingerprint(**json.loads(checkpoints["probe-v1"].read_text()))
    try:
        apply_weights(url, "vllm", "reload", str(checkpoints["v1"]))
        reset_prefix_cache(url, "vllm")
        served = verify(url, "vllm", SERVED, probe, 1e-3)
    finally:
        stop_vllm(proc)
    print(json.dumps({"bf16_max_abs_dlogp": served.max_abs_diff, "bf16_first_mismatch": served.first_mismatch}))
    assert not served.ok and (served.max_abs_diff > 1e-3 or served.first_mismatch is not None)
