"""The SSRF guard: which addresses webhooks may reach, and refusals at submit time before any I/O."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from typing import Any

import pytest

from jobq.deployment import Deployment
from jobq.errors import ConfigError, EndpointRefused
from jobq.netpolicy import NetPolicy, refusal_reason

from .conftest import Api
from .support import Receiver, webhook_job


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("fc00::1", "private"),
        ("100.64.0.1", "CGNAT"),
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("240.0.0.1", "private"),  # reserved (Python counts it as private)
        ("192.0.2.10", "private"),  # documentation range
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
        ("64:ff9b::a00:1", "private"),  # NAT64 of 10.0.0.1
        ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
    ],
)
def test_non_public_addresses_are_refused(address: str, reason: str) -> None:
    found = refusal_reason(ipaddress.ip_address(address))
    assert found is not None and reason in found


@pytest.mark.parametrize("address", ["93.184.215.14", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses_pass(address: str) -> None:
    assert refusal_reason(ipaddress.ip_address(address)) is None


def test_the_allow_list_opens_chosen_networks_but_metadata_only_by_exact_host() -> None:
    policy = NetPolicy(["127.0.0.0/8", "10.1.0.0/16", "169.254.0.0/16"])
    assert policy.refusal(ipaddress.ip_address("127.0.0.5")) is None
    assert policy.refusal(ipaddress.ip_address("::ffff:127.0.0.1")) is None
    assert policy.refusal(ipaddress.ip_address("10.1.2.3")) is None
    assert policy.refusal(ipaddress.ip_address("10.2.0.1")) == "private"
    assert policy.refusal(ipaddress.ip_address("169.254.1.1")) is None
    assert policy.refusal(ipaddress.ip_address("169.254.169.254")) == "a cloud metadata address"
    assert NetPolicy(["169.254.169.254/32"]).refusal(ipaddress.ip_address("169.254.169.254")) is None


def test_a_bad_allow_list_entry_names_the_setting() -> None:
    with pytest.raises(ConfigError, match="webhook_allow_cidrs"):
        NetPolicy(["10.0.0.0/33"])


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://files.example/x", "scheme"),
        ("file:///etc/passwd", "scheme"),
        ("https://user:pw@hooks.example/", "credentials"),
        ("http:///path-only", "no host"),
        ("http://hooks.example:99999/", "not a valid URL"),
    ],
)
def test_urls_that_are_not_plain_http_are_refused(url: str, message: str) -> None:
    with pytest.raises(EndpointRefused, match=message):
        NetPolicy().parse(url)


def test_a_name_that_does_not_resolve_is_refused() -> None:
    def nothing(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(EndpointRefused, match="does not resolve"):
        NetPolicy(resolver=nothing).check("https://nowhere.invalid/")


# -- refused at submission, before any connection ----------------------------------------------


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    seen: list[Any] = []
    original = socket.socket.connect

    def spy(self: socket.socket, address: Any) -> None:
        seen.append(address)
        original(self, address)

    monkeypatch.setattr(socket.socket, "connect", spy)
    return seen


@pytest.fixture
def strict_api(serve_api: Callable[..., Api], deployment: Deployment) -> Api:
    """The API with the real resolver and no allow-list (outside `jobq dev`)."""
    return serve_api(deployment, resolver=None)


def test_internal_endpoints_are_refused_before_any_connection(
    strict_api: Api, receiver: Callable[..., Receiver], connects: list[Any]
) -> None:
    client = strict_api.as_tenant("acme")
    client.get("/healthz")  # the client's own connection to the API, opened before the spy counts
    local = receiver()
    connects.clear()
    for endpoint, reason in [
        ("http://169.254.169.254/latest/meta-data/", "cloud metadata"),
        (f"http://127.0.0.1:{local.port}/hook", "loopback"),
        ("http://10.0.0.1/hook", "private"),
        (f"http://localhost:{local.port}/hook", "loopback"),  # a name that resolves to loopback
        ("http://[::ffff:169.254.169.254]/", "metadata"),
        ("http://100.64.1.1/", "CGNAT"),
        ("http://0x7f.1/", "loopback"),  # 127.0.0.1 spelled the way inet_aton reads it
    ]:
        response = client.post("/v1/jobs", json=webhook_job(endpoint))
        assert response.status_code == 400, (endpoint, response.text)
        error = response.json()["error"]
        assert (error["code"], error["field"]) == ("endpoint_refused", "target.endpoint")
        assert reason in error["message"], (endpoint, error["message"])
    assert connects == [], "no connection may be attempted to a refused endpoint"
    assert local.connections == 0
    assert client.get("/v1/jobs").json()["items"] == []  # nothing was stored


def test_the_allow_list_lets_a_local_endpoint_be_submitted(
    serve_api: Callable[..., Api], make_deployment: Callable[..., Deployment], receiver: Callable[..., Receiver]
) -> None:
    api = serve_api(make_deployment(webhook_allow_cidrs=("127.0.0.0/8", "::1/128")), resolver=None)
    local = receiver()
    response = api.as_tenant("acme").post("/v1/jobs", json=webhook_job(f"http://127.0.0.1:{local.port}/hook"))
    assert response.status_code == 201, response.text
    assert local.connections == 0  # accepting a job calls nothing
