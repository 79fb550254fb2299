"""The trainer-side SDK: submit a batch, iterate finished rollouts or whole GRPO groups, cancel,
collect the groups of a training step (`collect`, typed rows, `raas_client.batch`).

httpx + pydantic only: a trainer should not need raas' server dependencies to talk to it.
Every answer is the gateway's own wire model (`raas_client.models`, `health_models`,
`weight_models`, `validation_models`, `event_models`, `branch_models`): `JobView`, `RolloutView`, `Batch`, ...;
`RolloutView.model_validate(row)` types a stored JSON row.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import httpx

from raas_client.batch import Batch, Collector
from raas_client.branch_models import BranchCreate, BranchesAccepted, BranchList, RolloutTree, wait_tree
from raas_client.event_models import CallbackSecret, JobEvent
from raas_client.health_models import HealthView
from raas_client.models import (
    JobAccepted,
    JobList,
    JobView,
    LLMServerDeleted,
    LLMServerList,
    LLMServerView,
    ResultsPage,
    RolloutView,
)
from raas_client.validation_models import QuarantineView, ValidationView
from raas_client.weight_models import PoolPaused, PoolResumed, WeightPushReport
from raas_client.retry import (
    LONG_POLL_RETRY_STATUSES,
    LONG_POLL_SECONDS,
    RETRY_STATUSES,
    RetryPolicy,
    retry_total_from_env,
)


class RaasHTTPError(RuntimeError):
    """The service answered with an error; `body` is its JSON error."""

    def __init__(self, status: int, body: Any) -> None:
        message = body.get("message") if isinstance(body, dict) else str(body)
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.body = body


def as_instance(row: dict[str, Any]) -> dict[str, Any]:
    """One instance in the wire form `{instance_id, data}`.

    Accepts the wrapped form itself or a flat row (`{"instance_id": "p1", "problem": ...}`):
    everything but `instance_id` is then the data, as in a JSONL file for `raas submit`.
    """
    if not isinstance(row, dict) or "instance_id" not in row:
        raise ValueError(f"an instance needs an instance_id: {str(row)[:200]}")
    if set(row) <= {"instance_id", "data"}:
        return {"instance_id": str(row["instance_id"]), "data": row.get("data") or {}}
    return {"instance_id": str(row["instance_id"]), "data": {k: v for k, v in row.items() if k != "instance_id"}}


def http_error(resp: httpx.Response) -> RaasHTTPError:
    """The error an answer >= 400 carries (its JSON body, else its text)."""
    try:
        body = resp.json()
    except ValueError:
        body = resp.text
    return RaasHTTPError(resp.status_code, body)


class RaasClient:
    """A connection to one raas gateway.

    Reads (and submissions with an idempotency key) ride out a gateway restart: lost
    connections and 502/503/504 are retried with capped, jittered exponential backoff for up
    to `retry_total` seconds of consecutive failures (default `RAAS_RETRY_TOTAL`, else 600);
    `retry_max_wait` caps each wait. 4xx answers are raised at once.
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:8000",
        token: str | None = None,
        timeout: float = 120.0,
        retry_total: float | None = None,
        retry_max_wait: float = 10.0,
    ) -> None:
        total = retry_total_from_env() if retry_total is None else retry_total
        self.retry = RetryPolicy(total=total, first_wait=min(0.25, retry_max_wait), max_wait=retry_max_wait)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)
        self._collectors: dict[str, Collector] = {}

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def __enter__(self) -> RaasClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        resp = self._request(method, path, **kw)
        if resp.status_code >= 400:
            raise http_error(resp)
        return resp.json()

    def _request(
        self, method: str, path: str, retry: bool | None = None, statuses: frozenset[int] = RETRY_STATUSES, **kw: Any
    ) -> httpx.Response:
        """Send once, or (reads by default) retry under `self.retry` until an answer that is
        not 502/503/504 or the budget is spent. Writes are sent once unless the caller says
        they are safe to repeat (a submission with an idempotency key)."""
        backoff = self.retry.backoff() if (method == "GET" if retry is None else retry) else None
        while True:
            try:
                resp = self.http.request(method, path, **kw)
            except httpx.TransportError:
                if backoff is None or not backoff.wait():
                    raise
                continue
            if resp.status_code not in statuses or backoff is None or not backoff.wait():
                return resp

    def submit(self, agent: str, instances: list[dict[str, Any]], n_samples: int = 1, **job: Any) -> JobAccepted:
        """POST /v1/jobs; `instances` are flat rows or `{instance_id, data}` (see
        `as_instance`); `job` holds the other fields (sampling, limits, llm, ...)."""
        body = {"agent": agent, "instances": [as_instance(i) for i in instances], "n_samples": n_samples, **job}
        return JobAccepted.model_validate(
            self._call("POST", "/v1/jobs", json=body, retry=bool(body.get("idempotency_key")))
        )

    def job(self, job_id: str) -> JobView:
        """GET /v1/jobs/{id}."""
        return JobView.model_validate(self._call("GET", f"/v1/jobs/{job_id}"))

    def jobs(self, limit: int = 50, before: str | None = None, prefix: str | None = None) -> JobList:
        """GET /v1/jobs: newest first; pass `next_cursor` as `before` for the next page;
        `prefix` keeps the jobs whose id starts with it."""
        params: dict[str, Any] = {"limit": limit}
        if before:
            params["before"] = before
        if prefix:
            params["prefix"] = prefix
        return JobList.model_validate(self._call("GET", "/v1/jobs", params=params))

    def find_job(self, job_id: str) -> JobView:
        """The job named by its id or a unique prefix of it (the dashboard shows 12
        characters); LookupError when none or several match."""
        try:
            return self.job(job_id)
        except RaasHTTPError as exc:
            if exc.status != 404:
                raise
        jobs = self.jobs(limit=3, prefix=job_id).jobs
        matches = [j.job_id for j in jobs]
        if len(matches) == 1:
            return jobs[0]
        if not matches:
            raise LookupError(f"job {job_id!r} not found (neither a job id nor the start of one)")
        raise LookupError(
            f"job id prefix {job_id!r} is ambiguous: it starts "
            f"{', '.join(matches[:2])}{', ...' if len(matches) > 2 else ''}; "
            f"type more of the id"
        )

    def rollout(self, rollout_id: str) -> RolloutView:
        """GET /v1/rollouts/{id} with its turns."""
        return RolloutView.model_validate(self._call("GET", f"/v1/rollouts/{rollout_id}"))

    def cancel(self, job_id: str) -> JobView:
        """POST /v1/jobs/{id}/cancel."""
        return JobView.model_validate(self._call("POST", f"/v1/jobs/{job_id}/cancel"))

    def pause(self, job_id: str) -> JobView:
        """POST /v1/jobs/{id}/pause: queued rollouts wait unclaimed, started ones finish (a job
        with `health.on_critical: "pause"` is paused by its first critical alert)."""
        return JobView.model_validate(self._call("POST", f"/v1/jobs/{job_id}/pause"))

    def resume(self, job_id: str) -> JobView:
        """POST /v1/jobs/{id}/resume: the paused job's waiting rollouts are queued again."""
        return JobView.model_validate(self._call("POST", f"/v1/jobs/{job_id}/resume"))

    def results_page(self, job_id: str, after: int = 0, wait: float = 0, limit: int = 100) -> ResultsPage:
        """One long-polled page of finished rollouts after cursor `after` (a long poll
        also retries a 500: see `raas_client.retry.LONG_POLL_RETRY_STATUSES`)."""
        return ResultsPage.model_validate(
            self._call(
                "GET",
                f"/v1/jobs/{job_id}/results",
                params={"after": after, "wait": wait, "limit": limit},
                timeout=wait + 60,
                statuses=LONG_POLL_RETRY_STATUSES if wait else RETRY_STATUSES,
            )
        )

    def results(self, job_id: str, after: int = 0, wait: float = LONG_POLL_SECONDS) -> Iterator[RolloutView]:
        """Every finished rollout from cursor `after` until the job is done."""
        while True:
            page = self.results_page(job_id, after, wait)
            yield from page.items
            after = page.cursor
            if page.done:
                return

    def stream(self, job_id: str, after: int = 0, wait: float = 60) -> Iterator[RolloutView]:
        """Every finished rollout after cursor `after` from the NDJSON stream, until the job
        is done. A dropped stream (gateway restart, idle `wait` passed) reconnects from the
        last rollout's `seq`, so nothing repeats and nothing is skipped; connection failures
        are retried under `self.retry`, the budget restarting after each rollout received."""
        backoff = self.retry.backoff()
        while True:
            try:
                for item in self._stream_once(job_id, after, wait):
                    backoff.reset()
                    if item.seq is not None and item.seq > after:  # a replayed line after a reconnect
                        after = item.seq
                        yield item
            except (httpx.TransportError, RaasHTTPError) as exc:
                retryable = not isinstance(exc, RaasHTTPError) or exc.status in RETRY_STATUSES
                if not retryable or not backoff.wait():
                    raise
                continue
            # the server closed the stream cleanly: the job is done, or `wait` passed idle
            page = self.results_page(job_id, after, wait=0, limit=1)
            if page.done and not page.items:
                return

    def _stream_once(self, job_id: str, after: int, wait: float) -> Iterator[RolloutView]:
        """One NDJSON connection; an error answer raises `RaasHTTPError`, a torn line (the
        gateway died mid-write) `httpx.RemoteProtocolError`."""
        params = {"after": after, "wait": wait, "format": "ndjson"}
        with self.http.stream(
            "GET",
            f"/v1/jobs/{job_id}/results",
            params=params,
            timeout=httpx.Timeout(self.http.timeout.connect, read=wait + 60),
        ) as resp:
            if resp.status_code >= 400:
                resp.read()
                raise http_error(resp)
            for line in resp.iter_lines():
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError:
                    raise httpx.RemoteProtocolError(f"torn NDJSON line {line[:80]!r}") from None
                yield RolloutView.model_validate(row)

    def groups(self, job_id: str, wait: float = LONG_POLL_SECONDS) -> Iterator[list[RolloutView]]:
        """Whole GRPO groups (all samples of one instance), as each completes.

        With a straggler cut (`spare`, `group_timeout`) a group is its record's `members`:
        the first n usable samples (or fewer, a short group: see the closing row's
        `group.reason`); samples cut from it, which finish after it, are never yielded."""
        pending: dict[str, list[RolloutView]] = defaultdict(list)
        closed: set[str] = set()
        for item in self.results(job_id, wait=wait):
            instance = item.instance_id
            if instance in closed or item.cut_reason:
                continue
            pending[instance].append(item)
            if item.group_complete:
                rows = pending.pop(instance)
                if item.group is not None:
                    members = set(item.group.members)
                    rows = [r for r in rows if r.rollout_id in members]
                    closed.add(instance)
                yield sorted(rows, key=lambda r: r.sample_index)

    def events(self, job_id: str, after: int = 0, wait: float = 300) -> Iterator[JobEvent]:
        """The job's server-sent events (`raas_client.event_models`): `rollout`, `group`,
        `alert`, `job`; resumable: pass the last `id` seen as `after`."""
        headers = {"Accept": "text/event-stream", "Last-Event-ID": str(after)}
        with self.http.stream(
            "GET", f"/v1/jobs/{job_id}/events", params={"wait": wait}, headers=headers, timeout=httpx.Timeout(wait + 30)
        ) as resp:
            resp.raise_for_status()
            kind, ident, data = "message", after, []
            for line in resp.iter_lines():
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("id:"):
                    ident = int(line[3:].strip())
                elif line.startswith("data:"):
                    data.append(line[5:].strip())
                elif not line and data:
                    yield JobEvent.parse(kind, ident, json.loads("\n".join(data)))
                    kind, data = "message", []

    def callback_secret(self) -> str:
        """The secret this owner's job callbacks are signed with (`verify_callback`)."""
        return CallbackSecret.model_validate(self._call("GET", "/v1/callbacks/secret")).secret

    def collector(self, job_id: str, after: int = 0) -> Collector:
        """The job's collector (one per job and client): successive `collect` calls go on
        where the last one stopped."""
        if job_id not in self._collectors:
            self._collectors[job_id] = Collector(self, job_id, after)
        return self._collectors[job_id]

    def collect(
        self,
        job_id: str,
        groups: int,
        timeout: float = 600.0,
        max_staleness: int | None = None,
        current_version: Any = None,
        include_infra: bool = False,
    ) -> Batch:
        """The next K (`groups`) complete groups of the job, or those that complete within
        `timeout` seconds; samples more than `max_staleness` policy versions behind the
        current one are dropped and reported. See `raas_client.batch`."""
        return self.collector(job_id).collect(groups, timeout, max_staleness, current_version, include_infra)

    def reevaluate(self, rollout_id: str, wait: float = 0) -> RolloutView:
        """POST /v1/rollouts/{id}/reevaluate: grade the stored result again (SWE); the
        rollout as it is after `wait` seconds, `extra.reevaluation_request` naming the request."""
        return RolloutView.model_validate(
            self._call("POST", f"/v1/rollouts/{rollout_id}/reevaluate", params={"wait": wait}, timeout=wait + 60)
        )

    def branch(self, rollout_id: str, turn: int, n: int = 1, idempotency_key: str | None = None) -> BranchesAccepted:
        """POST /v1/rollouts/{id}/branches: `n` continuations of the rollout after its turn
        `turn` (one child job; see `raas_client.branch_models`). Sent again on a lost answer
        only with an idempotency key."""
        body = BranchCreate(turn=turn, n=n, idempotency_key=idempotency_key).model_dump(exclude_none=True)
        path = f"/v1/rollouts/{rollout_id}/branches"
        return BranchesAccepted.model_validate(self._call("POST", path, json=body, retry=bool(idempotency_key)))

    def branches(self, rollout_id: str) -> BranchList:
        """GET /v1/rollouts/{id}/branches: every branch of the rollout, by turn."""
        return BranchList.model_validate(self._call("GET", f"/v1/rollouts/{rollout_id}/branches"))

    def tree(self, rollout_id: str, timeout: float = 600.0, poll: float = 1.0) -> RolloutTree:
        """The rollout and its branches once all have finished (or as they stand after
        `timeout`); `RolloutTree.advantages()` scores each branch against its siblings."""
        return wait_tree(self, rollout_id, timeout, poll)

    def validate(
        self,
        agent: str,
        instances: list[dict[str, Any]],
        k: int = 3,
        name: str | None = None,
        wait: float = 600,
        **body: Any,
    ) -> ValidationView:
        """POST /v1/validations and poll it: each instance's gold solution and null action graded
        k times by EVAL; with `name`, the quarantine list a job names as `quarantine`. Returns
        the report once done (or as it stands after `wait` seconds)."""
        rows = [as_instance(i) for i in instances]
        view = ValidationView.model_validate(
            self._call(
                "POST", "/v1/validations", json={"agent": agent, "instances": rows, "k": k, "name": name, **body}
            )
        )
        deadline = time.monotonic() + wait
        while view.status in ("pending", "running") and time.monotonic() < deadline:
            time.sleep(0.5)
            view = ValidationView.model_validate(self._call("GET", f"/v1/validations/{view.validation_id}"))
        return view

    def job_health(self, job_id: str) -> HealthView:
        """GET /v1/jobs/{id}/health: live figures of the job's rollouts and its alerts."""
        return HealthView.model_validate(self._call("GET", f"/v1/jobs/{job_id}/health"))

    def quarantine(self, name: str) -> QuarantineView:
        """GET /v1/quarantine/{name}: the instances a job naming this list is refused for."""
        return QuarantineView.model_validate(self._call("GET", f"/v1/quarantine/{name}"))

    def add_llm_server(self, url: str, model: str | None = None, weight_version: str | None = None) -> LLMServerView:
        """Register an inference server with the shared pool."""
        return LLMServerView.model_validate(
            self._call("POST", "/v1/llm-servers", json={"url": url, "model": model, "weight_version": weight_version})
        )

    def update_llm_server(self, server_id: str, **fields: Any) -> LLMServerView:
        """PUT /v1/llm-servers/{id} (weight_version, paused, healthy, ...)."""
        return LLMServerView.model_validate(self._call("PUT", f"/v1/llm-servers/{server_id}", json=fields))

    def pause_llm_server(self, server_id: str) -> LLMServerView:
        """Stop sending new generations to a server (its rollouts wait) before a weight load."""
        return self.update_llm_server(server_id, paused=True)

    def resume_llm_server(self, server_id: str, weight_version: str | None = None) -> LLMServerView:
        """Resume a paused server, recording its new weight version from the next turn on."""
        fields: dict[str, Any] = {"paused": False}
        if weight_version is not None:
            fields["weight_version"] = weight_version
        return self.update_llm_server(server_id, **fields)

    def llm_servers(self, probe: bool = False) -> list[LLMServerView]:
        """The registered inference servers; `probe` has the gateway ask each one now
        (`reachable`, `probe_error`, `served_models`)."""
        params = {"probe": "1"} if probe else {}
        timeout = 30.0 if probe else httpx.USE_CLIENT_DEFAULT
        return LLMServerList.model_validate(
            self._call("GET", "/v1/llm-servers", params=params, timeout=timeout)
        ).servers

    def remove_llm_server(self, server_id: str) -> LLMServerDeleted:
        """Remove a registered server by id."""
        return LLMServerDeleted.model_validate(self._call("DELETE", f"/v1/llm-servers/{server_id}"))

    def pause_pool(self, servers: list[str] | None = None, timeout: float = 300.0) -> PoolPaused:
        """POST /v1/llm/pause: pause every server of the pool (or `servers`, ids) and return
        once no generation is in flight; `pause_seconds` is the measured pause time."""
        return PoolPaused.model_validate(
            self._call("POST", "/v1/llm/pause", json={"servers": servers, "timeout": timeout}, timeout=timeout + 60)
        )

    def resume_pool(self, weight_version: str | None = None, servers: list[str] | None = None) -> PoolResumed:
        """POST /v1/llm/resume: serve again; later turns record `weight_version` if given."""
        return PoolResumed.model_validate(
            self._call("POST", "/v1/llm/resume", json={"servers": servers, "weight_version": weight_version})
        )

    def push_weights(
        self,
        path: str,
        version: str,
        probe: dict[str, Any],
        mechanism: str = "reload",
        lora_name: str | None = None,
        tolerance: float = 1e-3,
        servers: list[str] | None = None,
        timeout: float = 300.0,
    ) -> WeightPushReport:
        """POST /v1/weights/push: pause the pool, load `path` on every server, verify it
        against `probe` (`raas_client.weights.probe_fingerprint`), record `version`, resume.

        A tied checkpoint is refused here before anything is sent (`TiedCheckpoint`). A push
        that cannot be verified raises RaasHTTPError 409 (`weight_push_failed`, per-server
        diffs in `body["details"]`) and leaves the pool paused: push again or `resume_pool()`.
        """
        from raas_client.weight_models import WeightPush
        from raas_client.weights import check_untied

        if mechanism == "reload":
            check_untied(path)
        body = WeightPush(
            version=version,
            mechanism=mechanism,
            path=str(path),
            lora_name=lora_name,
            tolerance=tolerance,
            servers=servers,
            timeout=timeout,
            probe=probe,
        )  # a bad probe fails here, by field
        return WeightPushReport.model_validate(
            self._call("POST", "/v1/weights/push", json=body.model_dump(mode="json"), timeout=timeout + 900)
        )


def verify_callback(secret: str, body: bytes, header: str, max_age: float = 300.0) -> bool:
    """Check a job callback's `X-Raas-Signature` (`t=<unix>,v1=<hex>`): HMAC-SHA256 of
    `"<t>." + body` with the owner's secret (`RaasClient.callback_secret`), at most
    `max_age` seconds old. Deduplicate deliveries on `X-Raas-Delivery` (at least once)."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs(time.time() - timestamp) > max_age:
        return False
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return hmac.compare_digest(mac.hexdigest(), parts.get("v1", ""))
