"""The /ui dashboard in a real headless Chromium against a real service.

One service per module (tests/pipeline_harness: gateway over HTTP, Celery worker processes,
reaper, embedded SQLite + embedded Redis) with `RAAS_API_TOKEN` set; rollouts come from the
`search` agent driven by the LLM simulator (a fake vLLM, named as such) through the pipeline,
tokenized with the real SmolLM2 tokenizer. Screenshots of every page are saved under
$RAAS_UI_ARTIFACTS (default: a temp dir) and the path is printed.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer

from fakellm.server import start_simulator
from raas_client import RaasClient
from bench.support.pipeline_harness import start_service, wait_for
from bench.support.browser import chromium, console_errors
from collections.abc import Iterator
from raas_client.models import JobAccepted

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = str(REPO / "tests" / "fixtures" / "smollm2-tokenizer")
QUESTIONS = {
    q["instance_id"]: q
    for q in map(json.loads, (REPO / "examples" / "search" / "questions.jsonl").read_text().splitlines())
}
TOKEN = "ui-test-token"  # tenant alice
OTHER = "ui-other-token"  # tenant bob
OPERATOR = "ui-operator-token"  # admin


def call(name: str, **arguments: str) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def drifting_reply(text: str) -> dict:
    """`text` sampled one character per token: valid, but not how the tokenizer splits it."""
    tok = Tokenizer.from_file(f"{SMOLLM2}/tokenizer.json")
    lead = [i for ch in "Searching now. " for i in tok.encode(ch, add_special_tokens=False).ids]
    end = tok.token_to_id("<|im_end|>")
    return {"ids": lead + tok.encode(text, add_special_tokens=False).ids + [end]}


def instance(iid: str) -> dict:
    return {"instance_id": iid, "data": {k: v for k, v in QUESTIONS[iid].items() if k != "instance_id"}}


@pytest.fixture(scope="module")
def artifacts() -> Path:
    path = Path(os.environ.get("RAAS_UI_ARTIFACTS") or tempfile.mkdtemp(prefix="raas-ui-"))
    path.mkdir(parents=True, exist_ok=True)
    print(f"\nUI screenshots: {path}")
    return path


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    svc = start_service(
        tmp_path_factory.mktemp("ui"),
        concurrency=2,
        extra={
            "api_token": OPERATOR,
            "api_tokens": {TOKEN: {"owner": "alice"}, OTHER: {"owner": "bob"}},
            "policy": {
                "llm": {
                    "server_urls": ["http://127.0.0.1:*", "http://127.0.0.2:*"],
                    "tokenizer_roots": [str(REPO / "tests" / "fixtures")],
                }
            },
        },
    )
    svc.client.close()
    svc.client = RaasClient(svc.url, token=TOKEN, timeout=60)
    svc.bob = RaasClient(svc.url, token=OTHER, timeout=60)
    yield svc
    svc.bob.close()
    svc.stop()


@pytest.fixture(scope="module")
def jobs(service) -> Iterator[dict[str, JobAccepted]]:
    """A finished job (completed with and without drift, agent_error), a slow one, another's."""
    good, bad, slow = QUESTIONS["search-003"], QUESTIONS["search-016"], QUESTIONS["search-002"]
    script = {
        "by_instance": {
            good["question"]: [drifting_reply(call("search", query=good["query"])), call("answer", text="128")],
            bad["question"]: [call("search", query=bad["query"]), call("answer", text="uuid1")],
            QUESTIONS["search-001"]["question"]: ["I am not sure what to do."],
            slow["question"]: [{"text": call("search", query="heapq"), "latency": 8}],
        }
    }
    url, stop = start_simulator(SMOLLM2, script)
    llm = {"servers": [{"url": url, "weight_version": "step-6"}], "tokenizer": SMOLLM2, "max_model_len": 4096}
    service.client.add_llm_server(url, weight_version="step-7")  # for the stage view
    main = service.client.submit(
        "search",
        [instance(i) for i in ("search-003", "search-016", "search-001")],
        n_samples=2,
        limits={"max_turns": 4},
        llm=llm,
    )
    other = service.bob.submit(
        "search",
        [instance("search-016")],
        llm=llm,  # another tenant
        limits={"max_turns": 4},
    )
    service.bob.add_llm_server(url.replace("127.0.0.1", "127.0.0.2"))  # bob's own pool
    service.wait_done(main.job_id, timeout=120)
    deadline = time.monotonic() + 120
    while service.bob.job(other.job_id).status == "running":
        assert time.monotonic() < deadline, "bob's job did not finish"
        time.sleep(0.2)
    slow_job = service.client.submit(
        "search", [instance("search-002")], llm=llm, limits={"max_turns": 30}
    )  # 8 s a turn: minutes
    yield {"main": main, "other": other, "slow": slow_job}
    stop()


@pytest.fixture(scope="module")
def browser(service, jobs):
    """Chromium logged in through the form."""
    with chromium() as driver:
        driver.get(f"{service.url}/ui/")
        driver.find_element("id", "token").send_keys(TOKEN)
        driver.find_element("css selector", "#login button").click()
        wait_for(lambda: driver.current_url.endswith("/ui/"))
        assert all("401" in m for m in console_errors(driver))  # the login page's own status
        yield driver


def shot(driver, artifacts: Path, name: str) -> None:
    driver.save_screenshot(str(artifacts / f"{name}.png"))


def test_pages_answer_401_without_the_token_and_404_across_tenants(service, jobs) -> None:
    main, other = jobs["main"], jobs["other"]
    with httpx.Client(base_url=service.url) as anon:
        page = anon.get("/ui/")
        assert page.status_code == 401 and 'id="login"' in page.text
        assert anon.get("/ui/?token=wrong").status_code == 401
        assert anon.get(f"/ui/jobs/{main.job_id}").status_code == 401
        assert anon.get(f"/ui/rollouts/{main.rollout_ids[0]}/tokens.json?segment=0").status_code == 401
        assert anon.post("/ui/login", data={"token": "wrong"}).status_code == 401
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=service.url, headers=auth) as mine:
        assert mine.get(f"/ui/jobs/{main.job_id}").status_code == 200
        assert mine.get(f"/ui/jobs/{other.job_id}").status_code == 404
        assert mine.get(f"/ui/rollouts/{other.rollout_ids[0]}").status_code == 404
        assert mine.get(f"/ui/rollouts/{other.rollout_ids[0]}/tokens.json?segment=0").status_code == 404
        assert mine.post(f"/ui/jobs/{other.job_id}/cancel").status_code == 404
        assert other.job_id not in mine.get("/ui/").text
    with httpx.Client(base_url=service.url, headers={"Authorization": f"Bearer {OTHER}"}) as bob:
        assert bob.get(f"/ui/jobs/{other.job_id}").status_code == 200
        assert bob.get(f"/ui/jobs/{main.job_id}").status_code == 404
        assert bob.get(f"/ui/rollouts/{main.rollout_ids[0]}").status_code == 404
    # The cookie is for /ui only: it never authenticates an API call.
    with httpx.Client(base_url=service.url) as browser_like:
        browser_like.post("/ui/login", data={"token": TOKEN})
        assert browser_like.get("/ui/").status_code == 200
        assert browser_like.get("/v1/jobs").status_code == 401


def test_jobs_page_lists_the_job_with_its_counts(service, jobs, browser, artifacts) -> None:
    main = service.client.job(jobs["main"].job_id)
    assert main.outcomes == {"completed": 4, "agent_error": 2}
    browser.get(f"{service.url}/ui/")
    # Read the row in one script: the rows refresh themselves while the slow job runs.
    shown, text = browser.execute_script(
        """
        const row = document.querySelector(`tr[data-job="${arguments[0]}"]`);
        const badges = {};
        row.querySelectorAll('.badge').forEach(
            b => { badges[b.dataset.outcome] = Number(b.querySelector('b').textContent); });
        return [badges, row.innerText];""",
        main.job_id,
    )
    assert shown == main.outcomes
    assert "6 / 6" in text and "search" in text
    assert jobs["other"].job_id not in browser.page_source
    shot(browser, artifacts, "jobs")
    assert console_errors(browser) == []


def test_rollout_page_shows_turns_tokens_mask_and_logprobs(service, jobs, browser, artifacts) -> None:
    job_id = jobs["main"].job_id
    browser.get(f"{service.url}/ui/")
    browser.find_element("css selector", f'tr[data-job="{job_id}"] a').click()  # click 1
    wait_for(lambda: browser.find_elements("id", "groups"))
    shot(browser, artifacts, "job")
    assert console_errors(browser) == []
    group = browser.find_element("css selector", 'tr.group[data-instance="search-003"]')
    group.find_element("css selector", "a.chip").click()  # click 2: a rollout
    wait_for(lambda: browser.find_elements("id", "conversation"))
    rollout_id = browser.current_url.rsplit("/", 1)[-1]
    stored = service.client.rollout(rollout_id)
    n_tokens = len(stored.prompt_ids) + len(stored.response_ids)
    assert len(browser.find_elements("css selector", ".turn")) == len(stored.turns) == 2
    assert int(browser.find_element("id", "n-tokens").text) == n_tokens
    assert int(browser.find_element("id", "n-trained").text) == sum(stored.loss_mask)
    browser.find_element("id", "expand-all").click()
    boxes = browser.find_elements("css selector", "details.tokens .tokbox")
    wait_for(lambda: all(b.get_attribute("data-loaded") for b in boxes))
    assert len(browser.find_elements("css selector", ".tokbox .tok")) == n_tokens
    trained = browser.find_elements("css selector", ".tokbox .tok.m1")
    assert len(trained) == sum(stored.loss_mask)
    # Hover the 5th trained token: the tip shows exactly the stored logprob.
    k = [i for i, m in enumerate(stored.loss_mask) if m == 1][4]
    from selenium.webdriver import ActionChains

    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", trained[4])
    ActionChains(browser).move_to_element(trained[4]).perform()
    tip = browser.find_element("id", "tip")
    wait_for(lambda: tip.is_displayed())
    lines = dict(line.split(" ", 1) for line in tip.text.splitlines())
    assert float(lines["logprob"].split()[0]) == stored.response_logprobs[k]
    assert f"id {stored.response_ids[k]}" in tip.text
    assert lines["mask"].startswith("1")
    assert json.loads(lines["piece"])  # decoded with the job's tokenizer on the server
    assert lines["policy"] == "version step-6" == f"version {stored.policy_versions[0]}"
    # The drift audit found the non-canonical tokens of turn 0; the first one is marked.
    assert stored.metrics["retokenization_drift"] > 0
    drift = browser.find_elements("css selector", ".tokbox .tok.drift")
    assert len(drift) == 1 and browser.find_element("id", "drift").is_displayed()
    assert "128" in browser.find_element("id", "artifacts").text  # the graded answer
    shot(browser, artifacts, "rollout")
    assert console_errors(browser) == []


def test_stage_view_shows_the_metrics_numbers(service, jobs, browser, artifacts) -> None:
    browser.get(f"{service.url}/ui/stages")
    metrics = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(httpx.get(f"{service.url}/metrics").text)
        for s in family.samples
    }
    done = sum(v for (name, labels), v in metrics.items() if name == "raas_rollouts" and ("status", "done") in labels)
    cell = browser.find_element("css selector", 'tr[data-status="done"] td.all')
    assert int(cell.text) == int(done) >= 6
    consumers = browser.find_element("css selector", 'tr[data-queue="init"] td.consumers')
    assert int(consumers.text) >= 1  # the INIT pool answered the broadcast
    assert metrics[("raas_queue_consumers", (("queue", "init"),))] == int(consumers.text)
    server = httpx.get(f"{service.url}/v1/llm-servers", headers={"Authorization": f"Bearer {TOKEN}"}).json()["servers"][
        0
    ]
    row = browser.find_element("css selector", f'tr[data-server="{server["id"]}"]')
    assert "step-7" in row.text and "healthy" in row.text
    assert (
        int(row.find_element("css selector", ".in-flight").text)
        == metrics[("raas_llm_server_in_flight", (("server", server["id"]),))]
    )
    assert len(browser.find_elements("css selector", "tr[data-server]")) == 1  # not bob's
    assert "127.0.0.2" not in browser.page_source
    shot(browser, artifacts, "stages")
    assert console_errors(browser) == []


def test_pause_then_resume_from_the_job_page(service, jobs, browser, artifacts) -> None:
    """The job page pauses a running job (its header says so and who paused it) and resumes it;
    the rollout that had started goes on either way."""
    job_id = jobs["slow"].job_id
    browser.get(f"{service.url}/ui/jobs/{job_id}")
    status = wait_for(lambda: _attribute_fresh(browser, "#job-header", "data-status"))
    if status != "running":
        pytest.fail(f"the slow job was {status!r} before the test could pause it")
    click_fresh(browser, "#job-header form.pause button")
    wait_for(lambda: _attribute_fresh(browser, "#job-header", "data-status") == "paused", what="the page to say paused")
    assert "paused by" in browser.find_element("css selector", "#paused").text
    assert service.client.job(job_id).status == "paused"
    shot(browser, artifacts, "job-paused")
    click_fresh(browser, "#job-header form.resume button")
    wait_for(lambda: _attribute_fresh(browser, "#job-header", "data-status") == "running", what="resumed")
    assert service.client.job(job_id).paused_at is None
    assert console_errors(browser) == []


def test_cancel_asks_first_then_the_jobs_page_follows_by_itself(service, jobs, browser, artifacts) -> None:
    job_id = jobs["slow"].job_id
    browser.get(f"{service.url}/ui/")
    row = f'tr[data-job="{job_id}"]'
    status = wait_for(lambda: _attribute_fresh(browser, row, "data-status"))
    if status != "running":  # "paused": the test above failed between its pause and its resume
        pytest.fail(f"the slow job was {status!r} before the test could cancel it")
    click_fresh(browser, f"{row} form.cancel button")
    alert = wait_for(lambda: _alert(browser))
    assert "Cancel job" in alert.text
    alert.dismiss()  # said no: nothing happens
    assert service.client.job(job_id).status == "running"
    click_fresh(browser, f"{row} form.cancel button")
    wait_for(lambda: _alert(browser)).accept()
    wait_for(lambda: service.client.job(job_id).status in ("cancelling", "cancelled"))
    wait_for(lambda: browser.current_url.endswith("/ui/"))
    browser.execute_script("window.notReloaded = true")
    # The running rollout stops at its next turn; the rows refresh without a reload.
    wait_for(
        lambda: _attribute_fresh(browser, row, "data-status") == "cancelled",
        timeout=60,
        what="the row to show cancelled",
    )
    assert browser.execute_script("return window.notReloaded") is True
    assert service.client.job(job_id).outcomes == {"cancelled": 1}
    shot(browser, artifacts, "jobs-cancelled")
    assert console_errors(browser) == []


def click_fresh(driver, selector: str) -> None:
    """Click, retrying when the page's self-refresh replaced the element under us (or the
    next page is still loading)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    for _ in range(10):
        try:
            driver.find_element("css selector", selector).click()
            return
        except (StaleElementReferenceException, NoSuchElementException):
            time.sleep(0.1)
    raise AssertionError(f"{selector} kept being replaced")


def _attribute_fresh(driver, selector: str, name: str) -> str | None:
    """An attribute of the element now under `selector`; None when the page's self-refresh
    replaced it between the lookup and the read, or when a form's POST is still navigating to
    the next page and the element is not there yet (the next poll looks it up again)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return driver.find_element("css selector", selector).get_attribute(name)
    except (StaleElementReferenceException, NoSuchElementException):
        return None


def _alert(driver):
    from selenium.common.exceptions import NoAlertPresentException

    try:
        return driver.switch_to.alert
    except NoAlertPresentException:
        return None
