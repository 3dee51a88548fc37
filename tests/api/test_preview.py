"""`POST /v1/schedules:preview` over real HTTP, and H on submitted jobs: what the API shows."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from jobq.client import Client
from jobq.crondialect import h_value
from jobq.cronpreview import PreviewSpec, preview_document
from jobq.deployment import Deployment

from .conftest import Api

NIGHTLY = {"cron_expression": "30 2 * * *", "timezone": "America/New_York", "count": 3, "after": "2026-03-07T00:00Z"}


@pytest.fixture
def acme(api: Api) -> httpx.Client:
    return api.as_tenant("acme")


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


def test_the_preview_shows_fires_in_local_time_and_utc_and_the_day_dst_skipped(acme: httpx.Client) -> None:
    r = acme.post("/v1/schedules:preview", json=NIGHTLY)

    assert r.status_code == 200, r.text
    body = r.json()
    assert body["cron_expression"] == "30 2 * * *" and body["timezone"] == "America/New_York"
    assert [(e["kind"], e["utc"], e["local"], e["dst"]) for e in body["events"]] == [
        ("fire", "2026-03-07T07:30:00.000Z", "2026-03-07T02:30:00-05:00", None),
        ("skipped", "2026-03-08T07:00:00.000Z", "2026-03-08T03:00:00-04:00", "gap"),
        ("fire", "2026-03-09T06:30:00.000Z", "2026-03-09T02:30:00-04:00", None),
        ("fire", "2026-03-10T06:30:00.000Z", "2026-03-10T02:30:00-04:00", None),
    ]
    assert "did not happen" in body["events"][1]["reason"]


def test_the_preview_is_the_same_document_as_jobq_cron_json(acme: httpx.Client) -> None:
    body = {**NIGHTLY, "dst_gap": "shift", "job_id": "ignored-without-h"}

    r = acme.post("/v1/schedules:preview", json=body)

    assert r.status_code == 200, r.text
    assert r.json() == preview_document(PreviewSpec.model_validate(body), 0)


def test_the_preview_needs_a_token(api: Api) -> None:
    r = api.client().post("/v1/schedules:preview", json=NIGHTLY)

    assert _error(r, 401)["code"] == "unauthorized"


@pytest.mark.parametrize(
    ("change", "status", "code", "field", "message"),
    [
        ({"cron_expression": "*/61 * * * *"}, 400, "invalid_cron", "cron_expression", "minute field: step 61"),
        ({"cron_expression": "R * * * *"}, 400, "invalid_cron", "cron_expression", "R (a random value) is refused"),
        ({"cron_expression": "H * * * *"}, 400, "invalid_cron", "cron_expression", "H picks its value"),
        ({"timezone": "Mars/Olympus"}, 400, "unknown_timezone", "timezone", "Mars/Olympus"),
        ({"after": "whenever"}, 400, "invalid_schedule", "after", "neither epoch milliseconds"),
        ({"count": 0}, 422, "validation_error", "count", ""),
        ({"count": 501}, 422, "validation_error", "count", ""),
        ({"surprise": 1}, 422, "validation_error", "surprise", ""),
    ],
)
def test_a_bad_preview_request_names_its_field(
    acme: httpx.Client, change: dict[str, Any], status: int, code: str, field: str, message: str
) -> None:
    error = _error(acme.post("/v1/schedules:preview", json={**NIGHTLY, **change}), status)

    assert (error["code"], error["field"]) == (code, field)
    assert message in error["message"]


def test_a_job_submitted_with_h_stores_and_shows_the_values_picked_from_its_id(
    acme: httpx.Client, deployment: Deployment
) -> None:
    job = {
        "job_id": "nightly-report",
        "schedule_type": "CRON",
        "cron_expression": "H H * * *",
        "target": {"type": "HTTP_WEBHOOK", "endpoint": "https://hooks.example.com/report"},
    }
    minute, hour = h_value("nightly-report", "minute", 0, 60), h_value("nightly-report", "hour", 0, 24)

    created = acme.post("/v1/jobs", json=job)

    assert created.status_code == 201, created.text
    body = created.json()
    assert (body["cron_expression"], body["cron_source"]) == (f"{minute} {hour} * * *", "H H * * *")
    assert all(t.endswith(f"T{hour:02d}:{minute:02d}:00.000Z") for t in body["next_fire_times"])
    shown = acme.get("/v1/jobs/nightly-report").json()
    assert (shown["cron_expression"], shown["cron_source"]) == (body["cron_expression"], "H H * * *")
    assert shown["next_fire_times"] == body["next_fire_times"]
    stored = Client(deployment, tenant_id="acme").job("nightly-report")
    assert (stored.schedule.cron, stored.schedule.cron_source) == (f"{minute} {hour} * * *", "H H * * *")
    preview = acme.post(
        "/v1/schedules:preview", json={"cron_expression": "H H * * *", "job_id": "nightly-report", "count": 5}
    ).json()
    assert [e["utc"] for e in preview["events"]][:4] == shown["next_fire_times"][:4]


def test_a_job_with_the_random_r_is_refused_and_nothing_is_stored(acme: httpx.Client) -> None:
    job = {
        "schedule_type": "CRON",
        "cron_expression": "R * * * * *",
        "target": {"type": "HTTP_WEBHOOK", "endpoint": "https://hooks.example.com/x"},
    }

    error = _error(acme.post("/v1/jobs", json=job), 400)

    assert (error["code"], error["field"]) == ("invalid_cron", "cron_expression")
    assert acme.get("/v1/jobs").json()["items"] == []
