"""One trace across real processes: `jobq api` → `jobq scanner` → `jobq worker` → the webhook
receiver, each process exporting to OpenTelemetry's in-memory exporter (tests/otel_cli.py)."""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api.support import Receiver, webhook_job
from procs import Processes, wait_until
from services import free_port

from jobq.api.tokens import issue_token, tenant_store
from jobq.settings import Settings
from jobq.wiring import connect

pytest.importorskip("opentelemetry.sdk", reason="tracing needs the extra: pip install 'jobq[otel]'")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

OTEL_CLI = [sys.executable, str(Path(__file__).with_name("otel_cli.py"))]


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    store = f"sqlite:///{tmp_path / 'jobq.db'}"
    env = {"JOBQ_STORE": store, "JOBQ_WEBHOOK_ALLOW_CIDRS": "127.0.0.0/8", "JOBQ_TRACING": "auto"}
    p = Processes(tmp_path, env)
    yield p
    p.stop_all()


def _spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_submitted_webhook_job_is_one_trace_from_the_request_to_the_receiver(
    procs: Processes, tmp_path: Path
) -> None:
    port = free_port()
    store = procs.env["JOBQ_STORE"]
    d = connect(Settings.load({"store": store}, env={}))
    token = issue_token(tenant_store(d), "acme", d.clock.now_ms())[1]
    d.close()
    roles = {"api": ("api", "--port", str(port)), "scanner": ("scanner",), "worker": ("worker", "-c", "2")}
    for name, args in roles.items():
        procs.start(name, *args, command=OTEL_CLI, extra_env={"JOBQ_TEST_SPANS": str(tmp_path / f"{name}.spans")})
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    with Receiver() as hook, httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=10) as http:

        def submitted() -> bool:
            try:
                r = http.post(
                    "/v1/jobs",
                    json=webhook_job(f"{hook.url}/charge", schedule_type="ONE_OFF", delay_seconds=1),
                    headers={"Authorization": f"Bearer {token}", "traceparent": f"00-{trace_id}-{caller_span}-01"},
                )
            except httpx.TransportError:
                return False
            assert r.status_code == 201, r.text
            return True

        try:
            wait_until(submitted, 60, "the API to take the job")
            wait_until(lambda: bool(hook.requests), 60, "the webhook call")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{procs.logs()}") from None
        [request] = hook.requests
    codes = procs.stop_all()
    assert codes == {"api": 0, "scanner": 0, "worker": 0}, procs.logs()

    api, scanner, worker = (_spans(tmp_path / f"{name}.spans") for name in roles)
    [submit] = [s for s in api if s["name"] == "jobq.submit"]
    [dispatch] = [s for s in scanner if s["name"] == "jobq.dispatch"]
    [execute] = [s for s in worker if s["name"].startswith("jobq.execute")]
    [call] = [s for s in worker if s["name"] == "jobq.webhook POST"]
    assert {s["trace_id"] for s in (submit, dispatch, execute, call)} == {trace_id}
    # The API continues the request's traceparent (through the server's own spans, if it makes any).
    parents = {s["span_id"]: s["parent_id"] for s in api}
    ancestor = submit["parent_id"]
    while ancestor in parents:
        ancestor = parents[ancestor]
    assert ancestor == caller_span
    assert dispatch["parent_id"] == submit["span_id"]
    assert execute["parent_id"] == dispatch["span_id"]
    assert call["parent_id"] == execute["span_id"]
    assert request.headers["traceparent"] == f"00-{trace_id}-{call['span_id']}-01"
    run_id = execute["attributes"]["jobq.run_id"]
    assert dispatch["attributes"]["jobq.run_id"] == run_id == request.headers["x-jobq-run-id"]
    assert (execute["attributes"]["jobq.attempt"], execute["attributes"]["jobq.tier"]) == (1, "default")
    assert execute["attributes"]["jobq.fence"] == dispatch["attributes"]["jobq.fence"] == 1
    assert dispatch["attributes"]["jobq.lateness_ms"] >= 0 and execute["attributes"]["jobq.lateness_ms"] >= 0
    assert (dispatch["kind"], execute["kind"], call["kind"]) == ("PRODUCER", "CONSUMER", "CLIENT")
