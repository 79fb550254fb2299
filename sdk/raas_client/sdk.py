"""The trainer-side SDK: submit a batch, iterate finished rollouts or whole GRPO groups, cancel.

Only httpx: a trainer should not need raas' server dependencies to talk to it.
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import httpx

from raas_client.retry import RETRY_STATUSES, RetryPolicy, retry_total_from_env


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
    return {"instance_id": str(row["instance_id"]),
            "data": {k: v for k, v in row.items() if k != "instance_id"}}


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

    def __init__(self, url: str = "http://127.0.0.1:8000", token: str | None = None,
                 timeout: float = 120.0, retry_total: float | None = None,
                 retry_max_wait: float = 10.0) -> None:
        total = retry_total_from_env() if retry_total is None else retry_total
        self.retry = RetryPolicy(total=total, first_wait=min(0.25, retry_max_wait),
                                 max_wait=retry_max_wait)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)

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

    def _request(self, method: str, path: str, retry: bool | None = None,
                 **kw: Any) -> httpx.Response:
        """Send once, or (reads by default) retry under `self.retry` until an answer that is
        not 502/503/504 or the budget is spent. Writes are sent once unless the caller says
        they are safe to repeat (a submission with an idempotency key)."""
        backoff = self.retry.backoff() if (method == "GET" if retry is None else retry) \
            else None
        while True:
            try:
                resp = self.http.request(method, path, **kw)
            except httpx.TransportError:
                if backoff is None or not backoff.wait():
                    raise
                continue
            if resp.status_code not in RETRY_STATUSES or backoff is None or not backoff.wait():
                return resp

    def submit(self, agent: str, instances: list[dict[str, Any]], n_samples: int = 1,
               **job: Any) -> dict[str, Any]:
        """POST /v1/jobs; `instances` are flat rows or `{instance_id, data}` (see
        `as_instance`); `job` holds the other fields (sampling, limits, llm, ...)."""
        body = {"agent": agent, "instances": [as_instance(i) for i in instances],
                "n_samples": n_samples, **job}
        return self._call("POST", "/v1/jobs", json=body,
                          retry=bool(body.get("idempotency_key")))

    def job(self, job_id: str) -> dict[str, Any]:
        """GET /v1/jobs/{id}."""
        return self._call("GET", f"/v1/jobs/{job_id}")

    def jobs(self, limit: int = 50, before: str | None = None) -> dict[str, Any]:
        """GET /v1/jobs: newest first; pass `next_cursor` as `before` for the next page."""
        params: dict[str, Any] = {"limit": limit}
        if before:
            params["before"] = before
        return self._call("GET", "/v1/jobs", params=params)

    def rollout(self, rollout_id: str) -> dict[str, Any]:
        """GET /v1/rollouts/{id} with its turns."""
        return self._call("GET", f"/v1/rollouts/{rollout_id}")

    def cancel(self, job_id: str) -> dict[str, Any]:
        """POST /v1/jobs/{id}/cancel."""
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")

    def results_page(self, job_id: str, after: int = 0, wait: float = 0,
                     limit: int = 100) -> dict[str, Any]:
        """One long-polled page of finished rollouts after cursor `after`."""
        return self._call("GET", f"/v1/jobs/{job_id}/results",
                          params={"after": after, "wait": wait, "limit": limit},
                          timeout=wait + 60)

    def results(self, job_id: str, after: int = 0, wait: float = 30) -> Iterator[dict[str, Any]]:
        """Every finished rollout from cursor `after` until the job is done."""
        while True:
            page = self.results_page(job_id, after, wait)
            yield from page["items"]
            after = page["cursor"]
            if page["done"]:
                return

    def stream(self, job_id: str, after: int = 0, wait: float = 60) -> Iterator[dict[str, Any]]:
        """Every finished rollout after cursor `after` from the NDJSON stream, until the job
        is done. A dropped stream (gateway restart, idle `wait` passed) reconnects from the
        last rollout's `seq`, so nothing repeats and nothing is skipped; connection failures
        are retried under `self.retry`, the budget restarting after each rollout received."""
        backoff = self.retry.backoff()
        while True:
            try:
                for item in self._stream_once(job_id, after, wait):
                    backoff.reset()
                    if item["seq"] > after:  # a replayed line after a reconnect is skipped
                        after = item["seq"]
                        yield item
            except (httpx.TransportError, RaasHTTPError) as exc:
                retryable = not isinstance(exc, RaasHTTPError) or exc.status in RETRY_STATUSES
                if not retryable or not backoff.wait():
                    raise
                continue
            # the server closed the stream cleanly: the job is done, or `wait` passed idle
            page = self.results_page(job_id, after, wait=0, limit=1)
            if page["done"] and not page["items"]:
                return

    def _stream_once(self, job_id: str, after: int, wait: float) -> Iterator[dict[str, Any]]:
        """One NDJSON connection; an error answer raises `RaasHTTPError`, a torn line (the
        gateway died mid-write) `httpx.RemoteProtocolError`."""
        params = {"after": after, "wait": wait, "format": "ndjson"}
        with self.http.stream("GET", f"/v1/jobs/{job_id}/results", params=params,
                              timeout=httpx.Timeout(self.http.timeout.connect, read=wait + 60)
                              ) as resp:
            if resp.status_code >= 400:
                resp.read()
                raise http_error(resp)
            for line in resp.iter_lines():
                if not line.strip():
                    continue
                try:
                    yield json.loads(line)
                except ValueError:
                    raise httpx.RemoteProtocolError(f"torn NDJSON line {line[:80]!r}") from None

    def groups(self, job_id: str, wait: float = 30) -> Iterator[list[dict[str, Any]]]:
        """Whole GRPO groups (all samples of one instance), as each completes."""
        pending: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for item in self.results(job_id, wait=wait):
            pending[item["instance_id"]].append(item)
            if item["group_complete"]:
                yield sorted(pending.pop(item["instance_id"]), key=lambda r: r["sample_index"])

    def reevaluate(self, rollout_id: str, wait: float = 0) -> dict[str, Any]:
        """POST /v1/rollouts/{id}/reevaluate: grade the stored result again (SWE)."""
        return self._call("POST", f"/v1/rollouts/{rollout_id}/reevaluate",
                          params={"wait": wait}, timeout=wait + 60)

    def add_llm_server(self, url: str, model: str | None = None,
                       weight_version: str | None = None) -> dict[str, Any]:
        """Register an inference server with the shared pool."""
        return self._call("POST", "/v1/llm-servers",
                          json={"url": url, "model": model, "weight_version": weight_version})

    def update_llm_server(self, server_id: str, **fields: Any) -> dict[str, Any]:
        """PUT /v1/llm-servers/{id} (weight_version, paused, healthy, ...)."""
        return self._call("PUT", f"/v1/llm-servers/{server_id}", json=fields)

    def pause_llm_server(self, server_id: str) -> dict[str, Any]:
        """Stop sending new generations to a server (its rollouts wait) before a weight load."""
        return self.update_llm_server(server_id, paused=True)

    def resume_llm_server(self, server_id: str, weight_version: str | None = None) -> dict[str, Any]:
        """Resume a paused server, recording its new weight version from the next turn on."""
        fields: dict[str, Any] = {"paused": False}
        if weight_version is not None:
            fields["weight_version"] = weight_version
        return self.update_llm_server(server_id, **fields)

    def llm_servers(self) -> list[dict[str, Any]]:
        """The registered inference servers."""
        return self._call("GET", "/v1/llm-servers")["servers"]

    def remove_llm_server(self, server_id: str) -> dict[str, Any]:
        """Remove a registered server by id."""
        return self._call("DELETE", f"/v1/llm-servers/{server_id}")

    def pause_pool(self, servers: list[str] | None = None,
                   timeout: float = 300.0) -> dict[str, Any]:
        """POST /v1/llm/pause: pause every server of the pool (or `servers`, ids) and return
        once no generation is in flight; `pause_seconds` is the measured pause time."""
        return self._call("POST", "/v1/llm/pause", json={"servers": servers, "timeout": timeout},
                          timeout=timeout + 60)

    def resume_pool(self, weight_version: str | None = None,
                    servers: list[str] | None = None) -> dict[str, Any]:
        """POST /v1/llm/resume: serve again; later turns record `weight_version` if given."""
        return self._call("POST", "/v1/llm/resume",
                          json={"servers": servers, "weight_version": weight_version})

    def push_weights(self, path: str, version: str, probe: dict[str, Any],
                     mechanism: str = "reload", lora_name: str | None = None,
                     tolerance: float = 1e-3, servers: list[str] | None = None,
                     timeout: float = 300.0) -> dict[str, Any]:
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
        body = WeightPush(version=version, mechanism=mechanism, path=str(path),
                          lora_name=lora_name, tolerance=tolerance, servers=servers,
                          timeout=timeout, probe=probe)  # a bad probe fails here, by field
        return self._call("POST", "/v1/weights/push", json=body.model_dump(mode="json"),
                          timeout=timeout + 900)
