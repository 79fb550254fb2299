"""Live health alerts through the whole service: real gateway, Celery workers, reaper, bwrap.

Three `math` jobs run against the LLM simulator (a fake vLLM, named as such). Each starts
healthy (a `python` call, then `finish` with the right answer: 2 turns); once three groups of a
job have started, the test rescripts the simulator for that job's problems, as a policy update
would change the model:

- `collapse`: `finish` at once (1 turn per rollout)           -> `turns_collapse`
- `no_tools`: a bare `\\boxed{answer}` (reward 1, no tool call) -> `reward_without_tools`
- `garbled`: tool calls whose JSON does not parse               -> `parse_failures`

Each alert must arrive within two groups of the first rollout showing the change (never before
it), and no other alert may fire in its job; it is checked on every channel: the job's SSE
stream (read live while the job runs), a signed callback to a real HTTP receiver, Prometheus
/metrics, the job's health API and `collect()`'s `Batch.health`, and the job page in headless
Chromium (the browser tier).
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.counters import metric_count
from fakellm.server import make_server
from raas_client.sdk import verify_callback
from bench.support.pipeline_harness import start_service, wait_for
from raas_client.health_models import AlertView

pytestmark = pytest.mark.service

REPO = Path(__file__).resolve().parents[1]
SMOLLM2 = str(REPO / "tests" / "fixtures" / "smollm2-tokenizer")
PROBLEMS = [json.loads(line) for line in (REPO / "examples" / "math.jsonl").read_text().splitlines() if line]
N_SAMPLES = 2
N_GROUPS = 6
HEALTHY = 3  # groups started before the policy changes
WITHIN_ROLLOUTS = 2 * N_SAMPLES  # an alert comes within two groups of the change


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def healthy(answer: str) -> list[str]:
    return [call("python", code="print(6 * 7)"), call("finish", answer=answer)]


# scenario: (changed replies, the alert it raises, thresholds, how a changed rollout shows)
CHANGES = {
    "collapse": (lambda answer: [call("finish", answer=answer)], "turns_collapse", {}, lambda m: m["turns"] == 1),
    "no_tools": (
        lambda answer: [f"The answer is \\boxed{{{answer}}}"],
        "reward_without_tools",
        {"turns_mean_at_most": None},
        lambda m: m["tool_calls"] == 0,
    ),
    "garbled": (
        lambda answer: ['<tool_call>{"name": "python", "arguments": {"code": "print(1)"</tool_call>'],
        "parse_failures",
        {},
        lambda m: m["malformed_tool_calls"] > 0,
    ),
}


def plan() -> dict[str, list[dict[str, Any]]]:
    """{scenario: instances}: distinct problems, so each job's replies can change on their own."""
    problems = iter(PROBLEMS)
    return {name: [next(problems) for _ in range(N_GROUPS)] for name in CHANGES}


def healthy_script(instances: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {"by_instance": {p["problem"]: healthy(p["answer"]) for ps in instances.values() for p in ps}}


def change_after_healthy_groups(server, problems: list[dict[str, Any]], change) -> None:
    """Rescript the job's problems once HEALTHY groups' worth of its rollouts started (their
    first turn answered): later rollouts meet the changed policy."""

    def started() -> int:
        with server.stats_lock:
            return sum(server.stats[f"turn:{p['problem']}:0"] for p in problems)

    wait_for(lambda: started() >= HEALTHY * N_SAMPLES, timeout=400, interval=0.02)
    for p in problems:
        server.script.by_instance[p["problem"]] = change(p["answer"])


class Receiver(ThreadingHTTPServer):
    """A trainer's callback endpoint: records (headers, body) of every POST."""

    def __init__(self) -> None:
        self.posts: list[tuple[dict[str, str], bytes]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(inner) -> None:  # noqa: N805
                body = inner.rfile.read(int(inner.headers["Content-Length"]))
                self.posts.append((dict(inner.headers), body))
                inner.send_response(200)
                inner.end_headers()

            def log_message(inner, *args: Any) -> None:  # noqa: N805
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    svc = start_service(tmp_path_factory.mktemp("health"), concurrency=2)
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def run(service):
    """The three jobs, run to the end with an SSE reader per job; what every channel saw."""
    instances = plan()
    server = make_server(SMOLLM2, healthy_script(instances))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = server.url
    receiver = Receiver()
    llm = {"servers": [{"url": url, "weight_version": "step-3"}], "tokenizer": SMOLLM2, "max_model_len": 4096}
    jobs, streams, readers = {}, {}, []
    for name, problems in instances.items():
        thresholds = {"window": 4, "min_rollouts": 4, **CHANGES[name][2]}
        jobs[name] = service.client.submit(
            "math",
            [
                {"instance_id": p["instance_id"], "data": {k: v for k, v in p.items() if k != "instance_id"}}
                for p in problems
            ],
            n_samples=N_SAMPLES,
            agent_config={"tools": ["python"], "python_env": None},
            limits={"max_turns": 4},
            llm=llm,
            health=thresholds,
            callback_url=f"http://127.0.0.1:{receiver.server_port}/hook",
        ).job_id
        streams[name] = []

        def read(job_id: str = jobs[name], seen: list = streams[name]) -> None:
            for event in service.client.events(job_id, wait=240):
                seen.append(event)

        readers.append(threading.Thread(target=read, daemon=True))
        readers[-1].start()
        changer = threading.Thread(
            target=change_after_healthy_groups,
            args=(server, problems, CHANGES[name][0]),
            daemon=True,
        )
        changer.start()
    for job_id in jobs.values():
        service.wait_done(job_id, timeout=400)
    for reader in readers:
        reader.join(timeout=60)
    metrics = httpx.get(f"{service.url}/metrics", timeout=60).text
    deadline = time.monotonic() + 30  # callbacks are delivered by the reaper's dispatcher thread
    while sum(h.get("X-Raas-Event") == "alert" for h, _ in receiver.posts) < len(jobs) and time.monotonic() < deadline:
        time.sleep(0.2)
    yield {"instances": instances, "jobs": jobs, "streams": streams, "receiver": receiver, "metrics": metrics}
    receiver.shutdown()
    server.shutdown()
    server.server_close()


def changed_seq(service, job_id: str, shows_change) -> int:
    """The completion seq of the job's first rollout that shows the change."""
    return min(r.seq for r in service.all_results(job_id) if shows_change(r.metrics))


@pytest.mark.parametrize("scenario", list(CHANGES))
def test_each_change_raises_its_alert_within_two_groups_on_the_stream(service, run, scenario) -> None:
    job_id, alert = run["jobs"][scenario], CHANGES[scenario][1]
    first = changed_seq(service, job_id, CHANGES[scenario][3])
    shown = [r for r in service.all_results(job_id) if CHANGES[scenario][3](r.metrics)]
    # the first groups stayed healthy (but for the rollouts in RUN at the change: 2 RUN slots)
    assert 2 <= len(shown) <= (N_GROUPS - HEALTHY) * N_SAMPLES + 2
    health = service.client.job_health(job_id)
    raised = [a for a in health.alerts]
    assert [a.name for a in raised] == [alert], (raised, health.recent)  # its alert, no other
    assert first <= raised[0].seq <= first + WITHIN_ROLLOUTS, (first, raised[0])
    assert raised[0].weight_version == "step-3"
    events = run["streams"][scenario]
    kinds = [e.event for e in events]
    assert kinds[-1] == "job" and kinds.count("alert") == 1, kinds  # pushed live, before the end
    pushed = next(e for e in events if e.event == "alert")
    assert isinstance(pushed.data, AlertView) and pushed.data.name == alert and pushed.id >= first
    assert "rollout" in kinds[: kinds.index("alert")]


def test_figures_say_what_changed(service, run) -> None:
    collapse = service.client.job_health(run["jobs"]["collapse"])
    hist = collapse.overall.turns_hist
    assert set(hist) == {"1", "2"} and sum(hist.values()) == N_GROUPS * N_SAMPLES and hist["2"] >= HEALTHY * N_SAMPLES
    assert collapse.recent.turns_mean <= 1.5 and collapse.overall.reward_mean == 1.0
    no_tools = service.client.job_health(run["jobs"]["no_tools"])
    # the recent window is the last 4 rollouts finished: the changed policy's, unless one that
    # started before the change (it calls a tool) finished among them on a loaded machine
    last = sorted(service.all_results(run["jobs"]["no_tools"]), key=lambda r: r.seq)[-4:]
    rewarded = [r for r in last if (r.reward or 0) > 0]
    without = sum(metric_count(r.metrics, "tool_calls") == 0 for r in rewarded) / len(rewarded)
    assert without >= 0.5 and no_tools.recent.reward_without_tools == without, last
    assert 0 < no_tools.overall.reward_without_tools < without
    garbled = service.client.job_health(run["jobs"]["garbled"])
    assert garbled.recent.parse_failure_rate >= 0.5 and 0.3 < garbled.overall.parse_failure_rate < 1
    assert set(garbled.by_weight_version) == {"step-3"} and garbled.overall.time_split["gen"] > 0


def test_alerts_reach_the_callback_signed(service, run) -> None:
    secret = service.client.callback_secret()
    alerts = {}
    for headers, body in run["receiver"].posts:
        if headers.get("X-Raas-Event") == "alert":
            assert verify_callback(secret, body, headers["X-Raas-Signature"])
            payload = json.loads(body)
            alerts[payload["job_id"]] = payload["alert"]["name"]
    assert alerts == {job_id: CHANGES[name][1] for name, job_id in run["jobs"].items()}


def test_prometheus_exports_health_and_active_alerts(run) -> None:
    text = run["metrics"]
    for name, job_id in run["jobs"].items():
        assert re.search(rf'raas_job_alert_active{{alert="{CHANGES[name][1]}",job_id="{job_id}"}} 1\.0', text), name
        assert f'raas_job_health{{figure="turns_mean",job_id="{job_id}"}}' in text
    collapse = run["jobs"]["collapse"]
    assert re.search(
        rf'raas_job_health_by_version{{figure="turns_mean",job_id="{collapse}",version="step-3"}} 1\.', text
    )


def test_collect_batch_carries_health(service, run) -> None:
    batch = service.client.collect(run["jobs"]["garbled"], groups=N_GROUPS, timeout=30)
    assert len(batch.groups) == N_GROUPS
    assert batch.health is not None and [a.name for a in batch.health.alerts] == ["parse_failures"]
    assert batch.health.recent.parse_failure_rate >= 0.5


def test_job_page_shows_the_alert_and_sparklines(service, run, tmp_path) -> None:
    from bench.support.browser import chromium, console_errors

    job_id = run["jobs"]["collapse"]
    with chromium() as browser:
        browser.get(f"{service.url}/ui/jobs/{job_id}")
        wait_for(lambda: browser.find_elements("id", "health"))
        banner = browser.find_element("css selector", '#health .alert[data-alert="turns_collapse"]')
        assert "turns per rollout collapsed" in banner.text
        tile = browser.find_element("css selector", '.tile[data-figure="turns_mean"]')
        assert "alerting" in tile.get_attribute("class") and tile.find_element("css selector", "polyline.sparkline")
        points = tile.find_element("css selector", "polyline").get_attribute("points").split()
        assert len(points) == N_GROUPS * N_SAMPLES  # one point per rollout here
        ys = [float(p.split(",")[1]) for p in points]
        half = len(ys) // 2  # fewer turns in the second half: the line drops (SVG y grows downward)
        assert sum(ys[half:]) / (len(ys) - half) > sum(ys[:half]) / half
        assert (
            browser.find_element("css selector", '.tile[data-figure="parse_failure_rate"]').get_attribute("class")
            == "tile"
        )
        browser.save_screenshot(str(tmp_path / "health.png"))
        assert console_errors(browser) == []
