"""`GET /v1/runs/{run_id}`: a run with its result, scoped to the token's tenant."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from jobq.daemons.worker import Worker
from jobq.deployment import Deployment
from jobq.tasks import TaskDef, TaskRegistry

from .conftest import Api


def _serve(serve_api: Callable[..., Api], make_deployment: Callable[..., Deployment]) -> Api:
    d = make_deployment()
    d.store.register_worker("w-test", ["t.add", "t.boom"], ["default"], d.clock.now_ms())
    return serve_api(d)


def _work(d: Deployment) -> None:
    def add(x: int, y: int) -> int:
        return x + y

    def boom() -> None:
        raise KeyError("invoice 42")

    registry = TaskRegistry()
    registry.add(TaskDef("t.add", add))
    registry.add(TaskDef("t.boom", boom))
    worker = Worker(d, registry, concurrency=1)
    try:
        while worker.run_once(d.clock.now_ms()):
            assert worker.wait_idle(10)
    finally:
        worker.shutdown()


def _submit(client: httpx.Client, task: str, **payload: Any) -> str:
    body = {"schedule_type": "IMMEDIATE", "target": {"type": "TASK", "task": task}, "payload": payload}
    body["retry_policy"] = {"max_retries": 0}
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    [run] = client.get(f"/v1/jobs/{response.json()['job_id']}/runs").json()["items"]
    return str(run["run_id"])


def test_a_run_is_pending_then_carries_the_tasks_return_value(
    serve_api: Callable[..., Api], make_deployment: Callable[..., Deployment]
) -> None:
    api = _serve(serve_api, make_deployment)
    client = api.as_tenant("acme")
    run_id = _submit(client, "t.add", args=[2, 3])
    pending = client.get(f"/v1/runs/{run_id}")
    assert pending.status_code == 200, pending.text
    assert (pending.json()["result_state"], pending.json()["result"]) == ("PENDING", None)
    _work(api.d)
    body = client.get(f"/v1/runs/{run_id}").json()
    assert (body["result_state"], body["result"], body["state"], body["run_id"]) == (
        "SUCCEEDED",
        5,
        "SUCCEEDED",
        run_id,
    )
    assert body["result_expires_at"] is not None


def test_a_failed_run_names_the_error_type_and_message(
    serve_api: Callable[..., Api], make_deployment: Callable[..., Deployment]
) -> None:
    api = _serve(serve_api, make_deployment)
    client = api.as_tenant("acme")
    run_id = _submit(client, "t.boom")
    _work(api.d)
    body = client.get(f"/v1/runs/{run_id}").json()
    assert (body["result_state"], body["error_type"], body["error"]) == ("FAILED", "KeyError", "'invoice 42'")


def test_another_tenants_run_is_not_found(
    serve_api: Callable[..., Api], make_deployment: Callable[..., Deployment]
) -> None:
    api = _serve(serve_api, make_deployment)
    run_id = _submit(api.as_tenant("tenant-a"), "t.add", args=[1, 1])
    response = api.as_tenant("tenant-b").get(f"/v1/runs/{run_id}")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "run_not_found"


def test_a_malformed_run_id_is_refused_as_not_found(
    serve_api: Callable[..., Api], make_deployment: Callable[..., Deployment]
) -> None:
    api = _serve(serve_api, make_deployment)
    response = api.as_tenant("acme").get("/v1/runs/no-fire-time")
    assert response.status_code == 404
