"""The W3C trace context of a POST /v1/jobs reaches the webhook the job calls (`traceparent`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from jobq.api.tokens import tenant_store
from jobq.daemons.scanner import Scanner
from jobq.daemons.worker import Worker
from jobq.deployment import Deployment
from jobq.models import JobKey
from jobq.netpolicy import NetPolicy
from jobq.tasks import TaskRegistry
from jobq.webhooks import HttpWebhookCaller

from .conftest import Api
from .support import Receiver, webhook_job

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture
def local_api(serve_api: Callable[..., Api], make_deployment: Callable[..., Deployment]) -> Api:
    return serve_api(make_deployment(webhook_allow_cidrs=("127.0.0.0/8",)), resolver=None)


def _drive(d: Deployment) -> None:
    caller = HttpWebhookCaller(tenant_store(d), NetPolicy(["127.0.0.0/8"]))
    worker = Worker(d, TaskRegistry(), webhook=caller, concurrency=1)
    try:
        for _ in range(5):
            moved = Scanner(d, scanner_id="scanner-test").run_once(d.clock.now_ms())
            worked = worker.run_once(d.clock.now_ms())
            assert worker.wait_idle(10)
            if not moved and not worked:
                break
    finally:
        worker.shutdown()
        caller.close()


def _submit(api: Api, hook: Receiver, **headers: str) -> str:
    client = api.as_tenant("acme")
    r = client.post("/v1/jobs", json=webhook_job(hook.url, schedule_type="ONE_OFF", delay_seconds=0), headers=headers)
    assert r.status_code == 201, r.text
    return str(r.json()["job_id"])


def test_the_request_s_traceparent_is_stored_with_the_job_and_its_run_and_sent_to_the_webhook(
    local_api: Api, receiver: Callable[..., Receiver]
) -> None:
    """Needs no tracer provider: the context travels even where nothing records spans."""
    hook = receiver()
    job_id = _submit(local_api, hook, traceparent=TRACEPARENT)
    job = local_api.d.store.get_jobs([JobKey("acme", job_id)])[JobKey("acme", job_id)]
    assert job.trace is not None and job.trace.split("-")[1] == TRACE_ID
    _drive(local_api.d)
    [request] = hook.requests
    assert request.headers["traceparent"].split("-")[1] == TRACE_ID


def test_a_malformed_traceparent_is_ignored_not_refused(local_api: Api, receiver: Callable[..., Receiver]) -> None:
    hook = receiver()
    job_id = _submit(local_api, hook, traceparent="00-not-a-trace-01")
    job = local_api.d.store.get_jobs([JobKey("acme", job_id)])[JobKey("acme", job_id)]
    assert job.trace is None


def test_the_webhook_call_is_a_client_span_whose_context_the_receiver_gets(
    local_api: Api, receiver: Callable[..., Receiver], spans: Any
) -> None:
    from opentelemetry.trace import SpanKind

    hook = receiver()
    job_id = _submit(local_api, hook, traceparent=TRACEPARENT)
    _drive(local_api.d)
    finished = {s.name: s for s in spans.get_finished_spans()}
    webhook, execute = finished["jobq.webhook POST"], finished["jobq.execute jobq.webhook"]
    assert webhook.kind is SpanKind.CLIENT and webhook.parent.span_id == execute.context.span_id
    assert {f"{s.context.trace_id:032x}" for s in finished.values()} == {TRACE_ID}
    [request] = hook.requests
    assert request.headers["traceparent"] == f"00-{TRACE_ID}-{webhook.context.span_id:016x}-01"
    attributes = webhook.attributes or {}
    assert (attributes["http.request.method"], attributes["http.response.status_code"]) == ("POST", 200)
    assert attributes["server.port"] == hook.port
    assert (finished["jobq.submit"].attributes or {})["jobq.job_id"] == job_id
