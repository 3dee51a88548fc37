"""Fixtures for the HTTP API tests: a deployment, the API served from a thread, tokens, receivers."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlite_template import fresh_sqlite

from jobq.api.app import create_app
from jobq.api.ratelimit import RateLimiter
from jobq.api.server import ApiServer, listen
from jobq.api.tokens import issue_token, tenant_store
from jobq.deployment import Deployment
from jobq.netpolicy import NetPolicy, Resolver
from jobq.settings import Settings
from jobq.wiring import connect

from .support import Receiver, Reply, client_tls, public_resolver, wait_for


@pytest.fixture
def make_deployment(tmp_path: Path) -> Iterator[Callable[..., Deployment]]:
    made: list[Deployment] = []

    def make(**settings: Any) -> Deployment:
        url = f"sqlite:///{fresh_sqlite(tmp_path / f'jobq{len(made)}.db')}"
        d = connect(Settings.load({"store": url, "history_flush_s": 0, **settings}, env={}))
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


@pytest.fixture
def deployment(make_deployment: Callable[..., Deployment]) -> Deployment:
    return make_deployment()


class Api:
    """The API served over real HTTP from a thread of the test process."""

    def __init__(self, d: Deployment, url: str) -> None:
        self.d = d
        self.url = url
        self._clients: list[httpx.Client] = []

    def token(self, tenant: str = "acme") -> str:
        return issue_token(tenant_store(self.d), tenant, self.d.clock.now_ms(), name="test")[1]

    def client(self, token: str | None = None, **headers: str) -> httpx.Client:
        auth = {"Authorization": f"Bearer {token}"} if token else {}
        client = httpx.Client(
            base_url=self.url, headers={**auth, **headers}, timeout=10, trust_env=False, verify=client_tls()
        )
        self._clients.append(client)
        return client

    def as_tenant(self, tenant: str) -> httpx.Client:
        return self.client(self.token(tenant))

    def close(self) -> None:
        for c in self._clients:
            c.close()


# API threads told to stop and not yet joined. uvicorn takes 0.1-0.2 s to stop, however idle (its
# main loop looks every 0.1 s, then it pauses 0.1 s for open connections): a test closes its clients
# and tells its server to stop, and the server finishes while the next tests run instead of in the
# test's teardown. Every one is joined, and must have ended, before the session ends.
_STOPPING: list[threading.Thread] = []


@pytest.fixture(scope="session", autouse=True)
def _stopped_servers_end() -> Iterator[None]:
    yield
    for thread in _STOPPING:
        thread.join(15)
    assert not [t for t in _STOPPING if t.is_alive()], "an API server did not stop within 15 s"


@pytest.fixture
def serve_api() -> Iterator[Callable[..., Api]]:
    """Start the API on a free port: `serve_api(d, resolver=..., limiter=...)`."""
    stops: list[Callable[[], None]] = []

    def serve(d: Deployment, *, resolver: Resolver | None = public_resolver, limiter: RateLimiter | None = None) -> Api:
        policy = NetPolicy.from_settings(d.settings, resolver)
        server = ApiServer(d, create_app(d, policy=policy, limiter=limiter), sock=listen("127.0.0.1", 0))
        thread, stop = server.start_thread()
        wait_for(lambda: server.started, 10, "the API to start")
        api = Api(d, server.url)

        def shutdown() -> None:
            api.close()
            stop.set()
            _STOPPING[:] = [t for t in _STOPPING if t.is_alive()]
            _STOPPING.append(thread)

        stops.append(shutdown)
        return api

    yield serve
    for stop in stops:
        stop()


@pytest.fixture
def api(serve_api: Callable[..., Api], deployment: Deployment) -> Api:
    return serve_api(deployment)


@pytest.fixture
def receiver() -> Iterator[Callable[..., Receiver]]:
    started: list[Receiver] = []

    def start(*replies: Reply, respond: Callable[..., Reply] | None = None) -> Receiver:
        r = Receiver(replies or (Reply(),), respond).__enter__()
        started.append(r)
        return r

    yield start
    for r in started:
        r.__exit__()
