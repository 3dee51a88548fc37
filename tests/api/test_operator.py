"""Operator tokens: one token that sees and changes every tenant's jobs over the HTTP API."""

from __future__ import annotations

import httpx
import pytest

from jobq.api.tokens import issue_token, tenant_store
from jobq.client import Client
from jobq.models import JobKey

from .conftest import Api

CRON = {
    "schedule_type": "CRON",
    "cron_expression": "@daily",
    "target": {"type": "HTTP_WEBHOOK", "endpoint": "https://hooks.example.com/x"},
}


@pytest.fixture
def operator(api: Api) -> httpx.Client:
    _record, secret = issue_token(tenant_store(api.d), None, api.d.clock.now_ms(), name="ops")
    return api.client(secret)


def _submit(client: httpx.Client, name: str, **fields: str) -> str:
    response = client.post("/v1/jobs", json={**CRON, "job_name": name, **fields})
    assert response.status_code == 201, response.text
    job_id: str = response.json()["job_id"]
    return job_id


def test_an_operator_token_lists_every_tenant_s_jobs_and_narrows_to_one(api: Api, operator: httpx.Client) -> None:
    a_job = _submit(api.as_tenant("tenant-a"), "a-report")
    b_job = _submit(api.as_tenant("tenant-b"), "b-report")
    listed = {(j["tenant_id"], j["job_id"]) for j in operator.get("/v1/jobs").json()["items"]}
    assert listed == {("tenant-a", a_job), ("tenant-b", b_job)}
    only_b = operator.get("/v1/jobs", params={"tenant_id": "tenant-b"}).json()["items"]
    assert [j["job_id"] for j in only_b] == [b_job]


def test_an_operator_names_a_tenant_s_job_with_tenant_id_and_can_change_it(api: Api, operator: httpx.Client) -> None:
    a = api.as_tenant("tenant-a")
    job_id = _submit(a, "a-report")
    assert operator.get(f"/v1/jobs/{job_id}").status_code == 404  # without tenant_id: the default tenant
    paused = operator.post(f"/v1/jobs/{job_id}:pause", params={"tenant_id": "tenant-a"})
    assert paused.status_code == 200, paused.text
    assert a.get(f"/v1/jobs/{job_id}").json()["job_status"] == "PAUSED"


def test_an_operator_submits_for_any_tenant(api: Api, operator: httpx.Client) -> None:
    job_id = _submit(operator, "for-a", tenant_id="tenant-a")
    assert api.as_tenant("tenant-a").get(f"/v1/jobs/{job_id}").status_code == 200


def test_an_operator_reads_any_tenant_s_run(api: Api, operator: httpx.Client) -> None:
    job_id = _submit(api.as_tenant("tenant-a"), "a-report")
    run = Client(api.d, tenant_id="tenant-a").trigger(JobKey("tenant-a", job_id))
    shown = operator.get(f"/v1/runs/{run.run_id}")
    assert shown.status_code == 200 and shown.json()["result_state"] == "PENDING"
    assert api.as_tenant("tenant-b").get(f"/v1/runs/{run.run_id}").status_code == 404


def test_a_tenant_token_naming_another_tenant_is_403(api: Api) -> None:
    a = api.as_tenant("tenant-a")
    response = a.get("/v1/jobs", params={"tenant_id": "tenant-b"})
    assert response.status_code == 403 and response.json()["error"]["code"] == "tenant_mismatch"
    assert a.get("/v1/jobs", params={"tenant_id": "tenant-a"}).status_code == 200
