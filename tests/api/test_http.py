"""The /v1 resources over real HTTP (the API served from a thread): shapes, idempotency, tenants,
errors and limits."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from factories import make_job

from jobq.api.ratelimit import RateLimiter
from jobq.api.tokens import hash_token, tenant_store
from jobq.client import Client
from jobq.daemons.worker import Worker
from jobq.deployment import Deployment
from jobq.models import Priority, RetryPolicy, Schedule, ScheduleType
from jobq.store.sqlite import SqliteStore
from jobq.tasks import TaskDef, TaskRegistry

from .conftest import Api
from .support import Receiver, Reply, drive, webhook_job

CRON = {
    "job_name": "monthly_billing_aggregation",
    "schedule_type": "CRON",
    "cron_expression": "@monthly",
    "timezone": "America/New_York",
    "priority": "high",
    "target": {"type": "HTTP_WEBHOOK", "endpoint": "https://billing.example.com/invoices"},
    "payload": {"billing_cycle": "2026-09"},
}


def _task_job(d: Deployment, **fields: Any) -> dict[str, Any]:
    d.store.register_worker("w-test", ["t.echo"], ["default"], d.clock.now_ms())
    return {"schedule_type": "IMMEDIATE", "target": {"type": "TASK", "task": "t.echo"}, **fields}


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["request_id"] == response.headers["x-request-id"]
    return error


@pytest.fixture
def acme(api: Api) -> httpx.Client:
    return api.as_tenant("acme")


# -- submitting --------------------------------------------------------------------------------


def test_a_cron_submission_is_201_with_the_normalised_expression_and_five_fire_times(acme: httpx.Client) -> None:
    r = acme.post("/v1/jobs", json=CRON)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["job_id"].startswith("job_") and r.headers["location"] == f"/v1/jobs/{body['job_id']}"
    assert (body["status"], body["schedule_type"], body["priority"]) == ("SCHEDULED", "CRON", "HIGH")
    assert body["cron_expression"] == "0 0 1 * *"
    assert len(body["next_fire_times"]) == 5 and body["next_fire_times"][0] == body["next_run_time_iso"]
    assert body["next_fire_times"][0].endswith("T04:00:00.000Z") or body["next_fire_times"][0].endswith(
        "T05:00:00.000Z"
    )
    assert body["next_run_time_epoch_ms"] == body["next_fire_times_epoch_ms"][0]
    assert body["created_at"].endswith("Z")


def test_tenant_id_defaults_to_the_token_s_tenant(acme: httpx.Client) -> None:
    assert acme.post("/v1/jobs", json=CRON).json()["tenant_id"] == "acme"
    assert acme.post("/v1/jobs", json={**CRON, "tenant_id": "acme"}).status_code == 201


def test_a_body_naming_another_tenant_is_refused(acme: httpx.Client) -> None:
    error = _error(acme.post("/v1/jobs", json={**CRON, "tenant_id": "globex"}), 403)
    assert (error["code"], error["field"]) == ("tenant_mismatch", "tenant_id")


def test_a_one_off_accepts_iso_or_epoch_ms(acme: httpx.Client, deployment: Deployment) -> None:
    at_ms = deployment.clock.now_ms() + 3_600_000
    by_ms = acme.post("/v1/jobs", json={**_task_job(deployment), "schedule_type": "ONE_OFF", "run_at": at_ms})
    assert by_ms.status_code == 201, by_ms.text
    iso = by_ms.json()["next_run_time_iso"]
    by_iso = acme.post("/v1/jobs", json={**_task_job(deployment), "schedule_type": "ONE_OFF", "run_at": iso})
    assert by_iso.json()["next_run_time_epoch_ms"] == at_ms


# -- idempotency -------------------------------------------------------------------------------


def test_the_same_key_and_body_replays_the_original_response_verbatim(acme: httpx.Client) -> None:
    first = acme.post("/v1/jobs", json=CRON, headers={"Idempotency-Key": "k-1"})
    again = acme.post("/v1/jobs", json=CRON, headers={"Idempotency-Key": "k-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert len(acme.get("/v1/jobs").json()["items"]) == 1


def test_the_same_key_with_another_body_is_a_409(acme: httpx.Client) -> None:
    assert acme.post("/v1/jobs", json=CRON, headers={"Idempotency-Key": "k-1"}).status_code == 201
    changed = {**CRON, "payload": {"billing_cycle": "2026-10"}}
    error = _error(acme.post("/v1/jobs", json=changed, headers={"Idempotency-Key": "k-1"}), 409)
    assert error["code"] == "idempotency_conflict" and "different request body" in error["message"]


def test_a_job_id_another_tenant_holds_is_free_and_reveals_nothing(api: Api) -> None:
    """Job ids are per tenant: posting another tenant's id creates one's own job (it used to be
    `409 duplicate_job`, telling the caller that the id existed elsewhere)."""
    acme, globex = api.as_tenant("acme"), api.as_tenant("globex")
    assert acme.post("/v1/jobs", json={**CRON, "job_id": "acme-secret", "job_name": "acme's"}).status_code == 201
    mine = globex.post("/v1/jobs", json={**CRON, "job_id": "acme-secret", "job_name": "globex's"})
    assert mine.status_code == 201, mine.text
    assert (mine.json()["job_id"], mine.json()["tenant_id"]) == ("acme-secret", "globex")
    assert mine.headers["location"] == "/v1/jobs/acme-secret"
    assert acme.get("/v1/jobs/acme-secret").json()["job_name"] == "acme's"
    assert globex.get("/v1/jobs/acme-secret").json()["job_name"] == "globex's"
    again = _error(globex.post("/v1/jobs", json={**CRON, "job_id": "acme-secret"}), 409)
    assert (again["code"], again["message"]) == ("duplicate_job", "a job with id 'acme-secret' already exists")
    assert globex.delete("/v1/jobs/acme-secret").status_code == 204
    assert acme.get("/v1/jobs/acme-secret").json()["job_status"] == "ACTIVE"
    assert [j["tenant_id"] for j in globex.get("/v1/jobs").json()["items"]] == ["globex"]


def test_idempotency_keys_belong_to_one_tenant(api: Api) -> None:
    a = api.as_tenant("acme").post("/v1/jobs", json=CRON, headers={"Idempotency-Key": "shared"})
    b = api.as_tenant("globex").post("/v1/jobs", json=CRON, headers={"Idempotency-Key": "shared"})
    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["job_id"] != b.json()["job_id"]


# -- reading and listing -----------------------------------------------------------------------


def test_a_job_shows_its_current_run_lease_fence_and_counts(acme: httpx.Client, deployment: Deployment) -> None:
    due_now = {**_task_job(deployment), "schedule_type": "ONE_OFF", "delay_seconds": 0}  # for the scanner to claim
    job_id = acme.post("/v1/jobs", json=due_now).json()["job_id"]
    [run] = Client(deployment, tenant_id="acme").runs(job_id).items
    deployment.store.claim([run.run_id], deployment.clock.now_ms(), "scanner-7", 10_000)
    body = acme.get(f"/v1/jobs/{job_id}").json()
    assert (body["status"], body["job_status"]) == ("CLAIMED", "ACTIVE")
    assert (body["current_lease_worker_id"], body["current_attempt"], body["fencing_token"]) == ("scanner-7", 1, 1)
    assert body["current_run"]["run_id"] == run.run_id
    assert body["run_counts"] == {"CLAIMED": 1}
    assert body["next_run_time_iso"] is not None and "last_heartbeat_at" in body


def test_a_job_whose_record_does_not_decode_is_shown_listed_and_cancelled(
    acme: httpx.Client, deployment: Deployment
) -> None:
    job_id = acme.post("/v1/jobs", json={**CRON, "job_id": "poison"}).json()["job_id"]
    store = deployment.store
    assert isinstance(store, SqliteStore)
    with store.db.write() as conn:  # as an older version, a hand edit or a bug could leave it
        conn.execute("UPDATE jobq_jobs SET doc = json_set(doc, '$.retry.max_retries', -1) WHERE job_id = ?", (job_id,))
    shown = acme.get(f"/v1/jobs/{job_id}")
    assert shown.status_code == 200, shown.text
    body = shown.json()
    assert body["corrupt"].startswith("retry.max_retries:") and body["job_name"] == CRON["job_name"]
    assert [(j["job_id"], j["corrupt"] is not None) for j in acme.get("/v1/jobs").json()["items"]] == [("poison", True)]
    assert _error(acme.post(f"/v1/jobs/{job_id}:pause"), 409)["code"] == "conflict"
    cancelled = acme.post(f"/v1/jobs/{job_id}:cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert (cancelled.json()["job_status"], cancelled.json()["corrupt"] is not None) == ("CANCELLED", True)


def test_listing_filters_by_status_priority_and_name_prefix_and_pages(acme: httpx.Client) -> None:
    ids = [acme.post("/v1/jobs", json={**CRON, "job_name": f"bill-{i}"}).json()["job_id"] for i in range(5)]
    low = acme.post("/v1/jobs", json={**CRON, "job_name": "other", "priority": "LOW"}).json()["job_id"]
    acme.post(f"/v1/jobs/{ids[0]}:pause")
    assert [j["job_id"] for j in acme.get("/v1/jobs?priority=LOW").json()["items"]] == [low]
    assert [j["job_id"] for j in acme.get("/v1/jobs?status=PAUSED").json()["items"]] == [ids[0]]
    seen, cursor = [], None
    while True:
        params: dict[str, Any] = {"job_name_prefix": "bill-", "limit": 2, **({"cursor": cursor} if cursor else {})}
        page = acme.get("/v1/jobs", params=params).json()
        seen += [j["job_id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(ids)


# -- actions -----------------------------------------------------------------------------------


def test_pause_resume_trigger_and_cancel_are_colon_actions(acme: httpx.Client) -> None:
    job_id = acme.post("/v1/jobs", json=CRON).json()["job_id"]
    assert acme.post(f"/v1/jobs/{job_id}:pause").json()["job_status"] == "PAUSED"
    assert _error(acme.post(f"/v1/jobs/{job_id}:pause"), 409)["code"] == "conflict"
    assert acme.post(f"/v1/jobs/{job_id}:resume").json()["job_status"] == "ACTIVE"
    triggered = acme.post(f"/v1/jobs/{job_id}:trigger")
    assert triggered.status_code == 201 and triggered.json()["state"] == "SCHEDULED"
    assert acme.post(f"/v1/jobs/{job_id}:cancel").json()["job_status"] == "CANCELLED"


def test_pausing_a_cron_job_with_runs_answers_200_and_shows_it_paused_with_no_next_run(acme: httpx.Client) -> None:
    every_second = {**CRON, "cron_expression": "* * * * * *"}  # its runs within the horizon exist
    job_id = acme.post("/v1/jobs", json=every_second).json()["job_id"]
    paused = acme.post(f"/v1/jobs/{job_id}:pause")
    assert paused.status_code == 200, paused.text
    for body in (paused.json(), acme.get(f"/v1/jobs/{job_id}").json()):
        assert (body["job_status"], body["status"], body["next_run_time_epoch_ms"]) == ("PAUSED", "PAUSED", None)
        assert body["next_fire_times"] == [] and body["current_run"]["state"] == "SCHEDULED"
    resumed = acme.post(f"/v1/jobs/{job_id}:resume").json()
    assert resumed["status"] == "SCHEDULED" and resumed["next_run_time_epoch_ms"] is not None


def test_a_job_stored_with_an_instant_past_year_9999_is_readable(acme: httpx.Client, deployment: Deployment) -> None:
    # A row written before instants were bounded at the edge, or by hand: reading it must not be a 500.
    year_33658 = 10**15
    old = make_job(
        "from-an-older-version", tenant_id="acme", schedule=Schedule(type=ScheduleType.ONE_OFF, at_ms=year_33658)
    )
    deployment.store.create_job(old.model_copy(update={"next_fire_ms": year_33658}), [])
    r = acme.get("/v1/jobs/from-an-older-version")
    assert r.status_code == 200, r.text
    assert (r.json()["next_run_time_iso"], r.json()["next_run_time_epoch_ms"]) == (
        "+033658-09-27T01:46:40.000Z",
        year_33658,
    )
    assert acme.get("/v1/jobs").status_code == 200


def test_webhook_header_values_are_write_only(acme: httpx.Client) -> None:
    headers = {"Authorization": "Bearer s3cr3t-t0ken", "X-Api-Key": "k3y", "Content-Type": "application/json"}
    job_id = acme.post("/v1/jobs", json={**CRON, "target": {**HOOK, "headers": headers}}).json()["job_id"]
    r = acme.get(f"/v1/jobs/{job_id}")
    assert r.json()["target"]["headers"] == {
        "Authorization": "***",
        "X-Api-Key": "***",
        "Content-Type": "application/json",
    }
    for action in ("pause", "resume", "cancel"):
        shown = acme.post(f"/v1/jobs/{job_id}:{action}").text
        assert "s3cr3t" not in shown and "k3y" not in shown


def test_an_unknown_action_is_a_json_404_and_a_get_on_an_action_a_405(acme: httpx.Client) -> None:
    job_id = acme.post("/v1/jobs", json=CRON).json()["job_id"]
    assert _error(acme.post(f"/v1/jobs/{job_id}:explode"), 404)["code"] == "not_found"
    assert _error(acme.get(f"/v1/jobs/{job_id}:pause"), 405)["code"] == "method_not_allowed"


def test_delete_cancels_is_idempotent_and_keeps_the_job_readable(acme: httpx.Client, deployment: Deployment) -> None:
    job_id = acme.post("/v1/jobs", json=_task_job(deployment)).json()["job_id"]
    assert acme.delete(f"/v1/jobs/{job_id}").status_code == 204
    assert acme.delete(f"/v1/jobs/{job_id}").status_code == 204
    body = acme.get(f"/v1/jobs/{job_id}").json()
    assert (body["job_status"], body["run_counts"]) == ("CANCELLED", {"CANCELLED": 1})
    assert _error(acme.delete("/v1/jobs/job_missing"), 404)["code"] == "job_not_found"


# -- runs and dead letters, with a real webhook caller and worker ------------------------------


NO_WAIT = {"max_retries": 3, "initial_interval_sec": 0, "max_interval_sec": 0}


@pytest.fixture
def flaky(receiver: Callable[..., Receiver]) -> Receiver:
    return receiver(Reply(503, b"busy"), Reply(200, b"done"))


@pytest.fixture
def local_api(serve_api: Callable[..., Api], make_deployment: Callable[..., Deployment]) -> Api:
    """An API whose deployment may submit webhooks to loopback receivers."""
    return serve_api(make_deployment(webhook_allow_cidrs=("127.0.0.0/8",)), resolver=None)


def test_runs_list_each_attempt_with_timings_outcome_and_error(local_api: Api, flaky: Receiver) -> None:
    client = local_api.as_tenant("acme")
    job_id = client.post("/v1/jobs", json=webhook_job(flaky.url, retry_policy=NO_WAIT)).json()["job_id"]
    drive(local_api.d)
    [run] = client.get(f"/v1/jobs/{job_id}/runs").json()["items"]
    assert (run["state"], run["attempt"], run["result"]) == ("SUCCEEDED", 2, {"status": 200, "body": "done"})
    first, second = run["attempts"]
    assert (first["attempt"], first["outcome"], second["outcome"]) == (1, "RETRYING", "SUCCEEDED")
    assert "HTTP 503" in first["error"] and second["error"] is None
    assert first["started_at"] <= first["finished_at"] <= second["started_at"]
    assert second["worker_id"] is not None and second["duration_ms"] is not None
    assert [e["event"] for e in run["events"]].count("STARTED") == 2


def test_a_failed_run_is_a_dead_letter_that_can_be_redriven(local_api: Api, receiver: Callable[..., Receiver]) -> None:
    refusing = receiver(Reply(400, b"bad input"))
    client = local_api.as_tenant("acme")
    job_id = client.post("/v1/jobs", json=webhook_job(refusing.url, retry_policy=NO_WAIT)).json()["job_id"]
    drive(local_api.d)
    [dead] = client.get("/v1/dlq").json()["items"]
    assert (dead["job_id"], dead["state"], dead["dead_letter"]) == (job_id, "FAILED", True)
    assert dead["result"] == {"status": 400, "body": "bad input"} and len(refusing.requests) == 1
    redriven = client.post(f"/v1/dlq/{dead['run_id']}:redrive").json()
    assert (redriven["state"], redriven["attempt"], redriven["dead_letter"]) == ("SCHEDULED", 2, False)
    assert client.get("/v1/dlq").json()["items"] == []
    assert _error(client.post(f"/v1/dlq/{dead['run_id']}:redrive"), 409)["code"] == "conflict"


# -- tenants and tokens ------------------------------------------------------------------------


def test_another_tenant_cannot_read_list_change_or_redrive_a_job(
    local_api: Api, receiver: Callable[..., Receiver]
) -> None:
    a, b = local_api.as_tenant("tenant-a"), local_api.as_tenant("tenant-b")
    failing = receiver(Reply(404, b"gone"))
    job_id = a.post("/v1/jobs", json=webhook_job(failing.url, retry_policy=NO_WAIT)).json()["job_id"]
    drive(local_api.d)
    [dead] = a.get("/v1/dlq").json()["items"]
    assert b.get("/v1/jobs").json()["items"] == [] and b.get("/v1/dlq").json()["items"] == []
    for response in (
        b.get(f"/v1/jobs/{job_id}"),
        b.get(f"/v1/jobs/{job_id}/runs"),
        b.post(f"/v1/jobs/{job_id}:cancel"),
        b.post(f"/v1/jobs/{job_id}:pause"),
        b.post(f"/v1/jobs/{job_id}:trigger"),
        b.delete(f"/v1/jobs/{job_id}"),
    ):
        assert _error(response, 404)["code"] == "job_not_found"
    assert _error(b.post(f"/v1/dlq/{dead['run_id']}:redrive"), 404)["code"] == "run_not_found"
    assert a.get(f"/v1/jobs/{job_id}").json()["job_status"] == "COMPLETED"  # untouched
    assert a.get("/v1/dlq").json()["items"][0]["run_id"] == dead["run_id"]
    assert dead["run_id"].startswith("tenant-a/")  # run ids name the tenant (but `default`'s)
    redriven = a.post(f"/v1/dlq/{dead['run_id']}:redrive")
    assert redriven.status_code == 200, redriven.text
    assert (redriven.json()["run_id"], redriven.json()["attempt"]) == (dead["run_id"], 2)


def test_a_missing_or_bad_token_is_401_with_a_bearer_challenge(api: Api) -> None:
    for client in (api.client(), api.client("jobq_" + "x" * 43), api.client(None, Authorization="Basic Zm9vOmJhcg==")):
        response = client.get("/v1/jobs")
        assert _error(response, 401)["code"] in {"unauthorized", "invalid_token"}
        assert response.headers["www-authenticate"].startswith("Bearer")


def test_a_revoked_token_stops_working_at_once(api: Api) -> None:
    token = api.token("acme")
    client = api.client(token)
    assert client.get("/v1/jobs").status_code == 200
    [record] = [t for t in tenant_store(api.d).list_tokens("acme") if t.token_hash == hash_token(token)]
    tenant_store(api.d).revoke_token(record.token_id, api.d.clock.now_ms())
    assert _error(client.get("/v1/jobs"), 401)["code"] == "invalid_token"


# -- validation and limits ---------------------------------------------------------------------


HOOK = {"type": "HTTP_WEBHOOK", "endpoint": "https://a.example"}


@pytest.mark.parametrize(
    ("change", "status", "code", "field"),
    [
        ({"surprise": 1}, 422, "validation_error", "surprise"),
        ({"job_name": "x" * 201}, 422, "validation_error", "job_name"),
        ({"target": {**HOOK, "bogus": 1}}, 422, "validation_error", "target.bogus"),
        ({"cron_expression": "61 * * * *"}, 400, "invalid_cron", "cron_expression"),
        ({"timezone": "Mars/Olympus"}, 400, "unknown_timezone", "timezone"),
        ({"schedule_type": "ONE_OFF"}, 400, "invalid_schedule", "cron_expression"),
        ({"target": {**HOOK, "headers": {f"h{i}": "v" for i in range(21)}}}, 400, "invalid_job", "target.headers"),
        ({"target": {**HOOK, "headers": {"X-Jobq-Fence": "9"}}}, 400, "invalid_job", "target.headers"),
    ],
)
def test_a_bad_submission_names_its_field(
    acme: httpx.Client, change: dict[str, Any], status: int, code: str, field: str
) -> None:
    error = _error(acme.post("/v1/jobs", json={**CRON, **change}), status)
    assert (error["code"], error["field"]) == (code, field)


def test_a_task_no_worker_has_served_is_accepted_with_a_warning(acme: httpx.Client) -> None:
    body = {"schedule_type": "IMMEDIATE", "target": {"type": "TASK", "task": "nobody.serves.this"}}
    response = acme.post("/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    [warning] = response.json()["warnings"]
    assert "no worker has served task 'nobody.serves.this' yet" in warning


def test_an_unknown_task_is_refused_under_the_refuse_setting(
    serve_api: Callable[..., Api], make_deployment: Callable[..., Deployment]
) -> None:
    acme = serve_api(make_deployment(unknown_tasks="refuse")).as_tenant("acme")
    body = {"schedule_type": "IMMEDIATE", "target": {"type": "TASK", "task": "nobody.serves.this"}}
    assert _error(acme.post("/v1/jobs", json=body), 400)["code"] == "unknown_task"


def test_a_submission_by_task_name_gets_the_declared_options_unless_it_sets_them(api: Api) -> None:
    registry = TaskRegistry()
    registry.add(TaskDef("billing.invoice", lambda customer_id: None, Priority.HIGH, RetryPolicy(max_retries=1), 60))
    Worker(api.d, registry, worker_id="w-billing").start()
    acme = api.as_tenant("acme")
    target = {"type": "TASK", "task": "billing.invoice"}
    declared = acme.post("/v1/jobs", json={"schedule_type": "IMMEDIATE", "target": target})
    assert declared.status_code == 201, declared.text
    assert "warnings" not in declared.json() or declared.json()["warnings"] == []
    job = Client(api.d, tenant_id="acme").job(declared.json()["job_id"])
    assert (job.priority, job.retry.max_retries, job.timeout_s) == (Priority.HIGH, 1, 60.0)
    overridden = acme.post("/v1/jobs", json={"schedule_type": "IMMEDIATE", "target": target, "priority": "LOW"})
    assert overridden.json()["priority"] == "LOW"
    [task] = acme.get("/v1/tasks").json()["items"]
    assert (task["name"], task["priority"], task["queue"], task["timeout_seconds"]) == (
        "billing.invoice",
        "HIGH",
        "high",
        60.0,
    )
    assert task["retry_policy"]["max_retries"] == 1 and task["parameters"] == ["customer_id"]
    assert task["published_by"] == "w-billing"


def test_invalid_json_and_a_non_json_content_type_are_refused(acme: httpx.Client) -> None:
    bad_json = acme.post("/v1/jobs", content=b"{nope", headers={"Content-Type": "application/json"})
    assert _error(bad_json, 422)["code"] == "invalid_json"
    form = acme.post("/v1/jobs", content=b"a=1", headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert _error(form, 415)["code"] == "unsupported_media_type"


def test_bodies_headers_and_payloads_over_their_limits_are_refused(
    serve_api: Callable[..., Api], make_deployment: Callable[..., Deployment]
) -> None:
    api = serve_api(make_deployment(api_max_body_bytes=2048, max_payload_bytes=512, api_max_header_bytes=4096))
    client = api.as_tenant("acme")
    error = _error(client.post("/v1/jobs", json={**CRON, "payload": "x" * 600}), 413)
    assert (error["code"], error["field"]) == ("payload_too_large", "payload")
    assert _error(client.post("/v1/jobs", json={**CRON, "payload": "x" * 3000}), 413)["code"] == "body_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit still holds while reading
        yield b'{"payload": "'
        for _ in range(10):
            yield b"x" * 500
        yield b'"}'

    chunked = client.post("/v1/jobs", content=chunks(), headers={"Content-Type": "application/json"})
    assert _error(chunked, 413)["code"] == "body_too_large"
    assert _error(client.get("/v1/jobs", headers={"X-Big": "y" * 5000}), 431)["code"] == "headers_too_large"


def test_submissions_beyond_the_tenant_s_rate_are_429_with_retry_after(
    serve_api: Callable[..., Api], deployment: Deployment
) -> None:
    api = serve_api(deployment, limiter=RateLimiter(rate_per_s=0.5, burst=2))
    acme, globex = api.as_tenant("acme"), api.as_tenant("globex")
    assert [acme.post("/v1/jobs", json=CRON).status_code for _ in range(2)] == [201, 201]
    limited = acme.post("/v1/jobs", json=CRON)
    assert _error(limited, 429)["code"] == "rate_limited"
    assert int(limited.headers["retry-after"]) >= 1
    assert globex.post("/v1/jobs", json=CRON).status_code == 201  # buckets are per tenant
    assert acme.get("/v1/jobs").status_code == 200  # reads are not limited


def test_a_crash_is_a_500_with_a_request_id_that_is_in_the_log(
    acme: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("jobq.api").addHandler(handler)

    def explode(self: Client, job_id: str) -> None:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(Client, "get", explode)
    try:
        response = acme.get("/v1/jobs/job_1", headers={"X-Request-Id": "trace-42"})
    finally:
        logging.getLogger("jobq.api").removeHandler(handler)
    error = _error(response, 500)
    assert (error["code"], error["request_id"]) == ("internal_error", "trace-42")
    assert "secret" not in response.text and "Traceback" not in response.text
    [crash] = [r for r in records if r.exc_info]
    assert getattr(crash, "request_id", None) == "trace-42" and "secret internals" in str(crash.exc_info[1])  # type: ignore[index]


# -- operations --------------------------------------------------------------------------------


def test_health_readiness_metrics_and_openapi_need_no_token(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    anonymous = api.client()
    assert anonymous.get("/healthz").json()["status"] == "ok"
    assert anonymous.get("/readyz").json() == {"status": "ok", "checks": {"store": "ok", "transport": "ok"}}
    assert "jobq_api_requests_total" in anonymous.get("/metrics").text
    paths = anonymous.get("/openapi.json").json()["paths"]
    assert {"/v1/jobs", "/v1/jobs/{job_id}:cancel", "/v1/dlq/{run_id}:redrive"} <= set(paths)

    def down(queue: str) -> int:
        raise OSError("broker down")

    monkeypatch.setattr(api.d.transport, "depth", down)
    assert _error(anonymous.get("/readyz"), 503)["code"] == "not_ready"
