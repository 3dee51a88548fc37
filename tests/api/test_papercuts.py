"""The HTTP papercuts of a newcomer's trial (issue 11): the Allow header, JSON too deep to parse,
a garbage cursor, a webhook on port 0, and webhook hosts resolved when the call is made."""

from __future__ import annotations

import socket
from collections.abc import Callable

import httpx
import pytest

from jobq.deployment import Deployment

from .conftest import Api
from .support import webhook_job


@pytest.fixture
def acme(api: Api) -> httpx.Client:
    return api.as_tenant("acme")


def _error(response: httpx.Response, status: int) -> dict[str, str]:
    assert response.status_code == status, response.text
    error: dict[str, str] = response.json()["error"]
    return error


def test_options_on_a_job_allows_get_and_delete(acme: httpx.Client) -> None:
    response = acme.options("/v1/jobs/job_1")
    assert response.status_code == 204
    assert response.headers["allow"] == "DELETE, GET, HEAD, OPTIONS"


def test_a_method_a_path_does_not_serve_is_405_naming_every_allowed_method(acme: httpx.Client) -> None:
    response = acme.put("/v1/jobs/job_1", json={})
    assert _error(response, 405)["code"] == "method_not_allowed"
    assert response.headers["allow"] == "DELETE, GET, HEAD, OPTIONS"


def test_json_nested_too_deeply_to_parse_is_422_invalid_json(acme: httpx.Client) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    response = acme.post("/v1/jobs", content=deep, headers={"Content-Type": "application/json"})
    assert _error(response, 422)["code"] == "invalid_json"


@pytest.mark.parametrize("cursor", ["garbage", "job_1", "|", "job 1|acme", "x" * 300])
def test_a_cursor_the_api_never_returned_is_400_invalid_cursor(acme: httpx.Client, cursor: str) -> None:
    error = _error(acme.get("/v1/jobs", params={"cursor": cursor}), 400)
    assert (error["code"], error["field"]) == ("invalid_cursor", "cursor")


def test_a_returned_cursor_still_pages(acme: httpx.Client) -> None:
    for i in range(3):
        body = {"job_id": f"job_{i}", **webhook_job("https://hooks.example.com/x")}
        assert acme.post("/v1/jobs", json=body).status_code == 201
    first = acme.get("/v1/jobs", params={"limit": 2}).json()
    rest = acme.get("/v1/jobs", params={"cursor": first["next_cursor"]}).json()
    assert [j["job_id"] for j in rest["items"]] == ["job_2"]


def test_a_webhook_on_port_0_is_refused(acme: httpx.Client) -> None:
    error = _error(acme.post("/v1/jobs", json=webhook_job("https://hooks.example.com:0/x")), 400)
    assert (error["code"], error["field"]) == ("endpoint_refused", "target.endpoint")
    assert "port 0" in error["message"]


def _unresolvable(host: str, port: int) -> list[str]:
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


def test_a_webhook_host_this_api_cannot_resolve_today_is_accepted(
    serve_api: Callable[..., Api], deployment: Deployment
) -> None:
    """The design's own example: the job fires in a month, from a worker that can resolve it."""
    client = serve_api(deployment, resolver=_unresolvable).as_tenant("acme")
    response = client.post("/v1/jobs", json=webhook_job("https://billing.internal.aws/invoices/generate"))
    assert response.status_code == 201, response.text


@pytest.mark.parametrize(
    ("endpoint", "reason"),
    [("http://localhost/hook", "loopback"), ("http://app.localhost/hook", "loopback"), ("http://10.1.2.3/", "private")],
)
def test_literal_addresses_and_localhost_are_checked_at_submission_without_a_lookup(
    serve_api: Callable[..., Api], deployment: Deployment, endpoint: str, reason: str
) -> None:
    client = serve_api(deployment, resolver=_unresolvable).as_tenant("acme")
    error = _error(client.post("/v1/jobs", json=webhook_job(endpoint)), 400)
    assert error["code"] == "endpoint_refused" and reason in error["message"]


def test_strict_submit_time_resolution_refuses_a_host_that_does_not_resolve(
    serve_api: Callable[..., Api], make_deployment: Callable[..., Deployment]
) -> None:
    strict = make_deployment(webhook_resolve_at_submit=True)
    client = serve_api(strict, resolver=_unresolvable).as_tenant("acme")
    error = _error(client.post("/v1/jobs", json=webhook_job("https://billing.internal.aws/x")), 400)
    assert error["code"] == "endpoint_refused" and "does not resolve" in error["message"]
