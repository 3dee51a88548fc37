"""End to end with real processes: `jobq api`, `jobq beat`, `scanner`, `worker` and `reaper` on one
SQLite file, driven over HTTP, calling real webhook receivers on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from procs import JOBQ, Processes
from services import free_port

from jobq.api.tokens import issue_token, tenant_store
from jobq.contrib.webhook_verify import verify
from jobq.deployment import Deployment
from jobq.settings import Settings
from jobq.wiring import connect

from .support import Receiver, Reply, wait_for, webhook_job

pytestmark = pytest.mark.slow

FAST_RETRY = {"max_retries": 4, "initial_interval_sec": 0.1, "max_interval_sec": 0.2}


class Stack:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.store = f"sqlite:///{workdir / 'jobq.db'}"
        self.env = {"JOBQ_STORE": self.store, "JOBQ_WEBHOOK_ALLOW_CIDRS": "127.0.0.0/8"}
        self.procs = Processes(workdir, self.env)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.d: Deployment = connect(Settings.load({"store": self.store, "history_flush_s": 0}, env={}))
        self.clients: list[httpx.Client] = []

    def start(self) -> None:
        self.procs.start("api", "api", "--port", str(self.port))
        for role in ("beat", "scanner", "reaper"):
            self.procs.start(role, role)
        self.procs.start("worker", "worker", "-c", "4")
        self.wait(self._healthy, 60, "the API to answer /healthz")

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def wait(self, predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
        try:
            return wait_for(predicate, timeout_s, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.procs.logs()}") from None

    def client(self, tenant: str) -> httpx.Client:
        token = issue_token(tenant_store(self.d), tenant, self.d.clock.now_ms())[1]
        return self.client_for(token)

    def client_for(self, token: str) -> httpx.Client:
        c = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=10, trust_env=False)
        self.clients.append(c)
        return c

    def close(self) -> None:
        for c in self.clients:
            c.close()
        codes = self.procs.stop_all()
        self.d.close()
        assert all(code == 0 for code in codes.values()), (codes, self.procs.logs())


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("stack"))
    try:
        s.start()
        yield s
    finally:
        s.close()


@pytest.fixture
def receiver() -> Iterator[Callable[..., Receiver]]:
    started: list[Receiver] = []

    def start(*replies: Reply) -> Receiver:
        r = Receiver(replies or (Reply(),)).__enter__()
        started.append(r)
        return r

    yield start
    for r in started:
        r.__exit__()


def _runs(client: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.get(f"/v1/jobs/{job_id}/runs").json()["items"]
    return items


def test_a_token_made_with_the_cli_works_against_the_api_process(stack: Stack) -> None:
    result = subprocess.run(
        [*JOBQ, "tokens", "create", "--tenant", "cli-tenant", "--quiet"],
        cwd=stack.workdir,
        env={**os.environ, **stack.env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    token = result.stdout.strip()
    assert token.startswith("jobq_")
    assert stack.client_for(token).get("/v1/jobs").json() == {"items": [], "next_cursor": None}


def test_a_cron_webhook_fires_signed_with_its_run_id_and_fence(stack: Stack, receiver: Callable[..., Receiver]) -> None:
    hook = receiver()
    client = stack.client("acme")
    secret = tenant_store(stack.d).tenant_secret("acme", "whsec_test-made-it-first")
    body = webhook_job(f"{hook.url}/tick", schedule_type="CRON", cron_expression="*/2 * * * * *")
    created = client.post("/v1/jobs", json=body)
    assert created.status_code == 201, created.text
    job_id = created.json()["job_id"]
    stack.wait(lambda: hook.requests, 15, "the cron webhook to fire")
    got = hook.requests[0]
    h = got.headers
    assert verify(secret, h["x-jobq-timestamp"], got.body, h["x-jobq-signature"])
    # the run id names the tenant (every tenant but `default`): the same job id in two tenants, two ids
    assert h["x-jobq-run-id"].startswith(f"acme/{job_id}:") and h["idempotency-key"] == h["x-jobq-run-id"]
    assert int(h["x-jobq-fence"]) >= 1 and h["x-jobq-attempt"] == "1"
    run_id = h["x-jobq-run-id"]
    done = stack.wait(
        lambda: [r for r in _runs(client, job_id) if r["run_id"] == run_id and r["state"] == "SUCCEEDED"],
        10,
        "the run to be recorded as SUCCEEDED",
    )
    # Deleted only now: a delete cancels unfinished runs, so one that raced the outcome's write
    # would be cancelled and its (correctly) fenced-out outcome never recorded.
    assert client.delete(f"/v1/jobs/{job_id}").status_code == 204
    assert done[0]["result"] == {"status": 200, "body": "ok"}
    assert done[0]["fencing_token"] == int(h["x-jobq-fence"])


def test_two_503s_then_a_200_make_exactly_three_calls_with_backoff(
    stack: Stack, receiver: Callable[..., Receiver]
) -> None:
    busy = Reply(503, b"busy", {"Retry-After": "1"})
    hook = receiver(busy, busy, Reply(200, b"finally"))
    client = stack.client("acme")
    job_id = client.post("/v1/jobs", json=webhook_job(hook.url, retry_policy=FAST_RETRY)).json()["job_id"]
    stack.wait(lambda: [r for r in _runs(client, job_id) if r["state"] == "SUCCEEDED"], 20, "the third call to succeed")
    [run] = _runs(client, job_id)
    assert (run["attempt"], run["result"]) == (3, {"status": 200, "body": "finally"})
    assert len(hook.requests) == 3
    gaps = [b.at - a.at for a, b in zip(hook.requests, hook.requests[1:], strict=False)]
    assert all(gap >= 0.9 for gap in gaps), gaps  # Retry-After: 1 is honoured over the shorter backoff
    assert [r.headers["x-jobq-attempt"] for r in hook.requests] == ["1", "2", "3"]
    assert len({r.headers["idempotency-key"] for r in hook.requests}) == 1
    outcomes = [a["outcome"] for a in stack.wait(lambda: _complete_attempts(client, job_id, 3), 5, "the history")]
    assert outcomes == ["RETRYING", "RETRYING", "SUCCEEDED"]


def _complete_attempts(client: httpx.Client, job_id: str, n: int) -> list[dict[str, Any]] | None:
    attempts: list[dict[str, Any]] = _runs(client, job_id)[0]["attempts"]
    return attempts if len(attempts) == n and attempts[-1]["outcome"] else None


def test_a_400_is_called_once_and_the_run_is_dead_lettered(stack: Stack, receiver: Callable[..., Receiver]) -> None:
    hook = receiver(Reply(400, b"invalid invoice"))
    client, other = stack.client("acme"), stack.client("globex")
    job_id = client.post("/v1/jobs", json=webhook_job(hook.url, retry_policy=FAST_RETRY)).json()["job_id"]
    dead = stack.wait(
        lambda: [r for r in client.get("/v1/dlq").json()["items"] if r["job_id"] == job_id], 15, "the dead letter"
    )
    assert (dead[0]["state"], dead[0]["attempt"]) == ("FAILED", 1)
    assert dead[0]["result"] == {"status": 400, "body": "invalid invoice"}
    assert "HTTP 400" in dead[0]["last_error"]
    threading.Event().wait(1.0)  # a retry would have come by now (backoff <= 0.2 s)
    assert len(hook.requests) == 1
    assert other.post(f"/v1/dlq/{dead[0]['run_id']}:redrive").status_code == 404  # not globex's
    assert other.get(f"/v1/jobs/{job_id}").status_code == 404


def test_twenty_concurrent_submissions_with_one_key_create_one_job(stack: Stack) -> None:
    client = stack.client("idem")
    body = webhook_job("http://127.0.0.1:9/never-called", schedule_type="ONE_OFF", delay_seconds=3600)
    start = threading.Barrier(20)

    def submit(_: int) -> httpx.Response:
        start.wait()
        return client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "one-key"})

    with ThreadPoolExecutor(20) as pool:
        responses = list(pool.map(submit, range(20)))
    assert sorted(r.status_code for r in responses) == [200] * 19 + [201], [r.text for r in responses]
    assert len({r.json()["job_id"] for r in responses}) == 1
    assert len({r.content for r in responses}) == 1  # replays are the original response, verbatim
    assert len(client.get("/v1/jobs").json()["items"]) == 1


def test_the_api_process_serves_metrics_and_readiness(stack: Stack) -> None:
    assert httpx.get(f"{stack.url}/readyz", timeout=5).json()["status"] == "ok"
    assert "jobq_api_requests_total" in httpx.get(f"{stack.url}/metrics", timeout=5).text
    assert sys.executable  # the processes run with this interpreter (tests/procs.py)
