"""Test helpers for the HTTP API: a scriptable webhook receiver on loopback, and job bodies."""

from __future__ import annotations

import functools
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socket import socket
from typing import Any

from jobq.api.tokens import tenant_store
from jobq.daemons.scanner import Scanner
from jobq.daemons.worker import Worker
from jobq.deployment import Deployment
from jobq.netpolicy import NetPolicy
from jobq.tasks import TaskRegistry
from jobq.webhooks import HttpWebhookCaller

# A public address the fake resolvers answer with; tests never send traffic to it.
PUBLIC_IP = "93.184.215.14"


@functools.cache
def client_tls() -> ssl.SSLContext:
    """One TLS context for the tests' HTTP clients: the API and the receivers speak plain HTTP, yet
    httpx would load the CA bundle for each client it makes (~25 ms each)."""
    return ssl.create_default_context()


def public_resolver(host: str, port: int) -> list[str]:
    """Every name is public: submissions pass the network policy without DNS or traffic."""
    return [PUBLIC_IP]


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b"ok"
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    at: float  # time.monotonic()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    connections = 0

    def get_request(self) -> tuple[socket, Any]:
        accepted = super().get_request()
        self.connections += 1
        return accepted


class Receiver:
    """A real HTTP server on 127.0.0.1 answering from a script: `replies` in order (the last one
    repeats), or `respond(received) -> Reply`. Records every request and counts TCP connections."""

    def __init__(self, replies: Sequence[Reply] = (Reply(),), respond: Callable[[Received], Reply] | None = None):
        self.replies = list(replies)
        self.respond = respond
        self.requests: list[Received] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, so connection reuse is observable

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                got = Received(self.command, self.path, headers, body, time.monotonic())
                reply = receiver._record(got)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), name="receiver", daemon=True)

    def _record(self, got: Received) -> Reply:
        with self._lock:
            self.requests.append(got)
            n = len(self.requests)
        if self.respond is not None:
            return self.respond(got)
        return self.replies[min(n, len(self.replies)) - 1]

    @property
    def connections(self) -> int:
        return self.server.connections

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def webhook_job(endpoint: str, **fields: Any) -> dict[str, Any]:
    """A POST /v1/jobs body for an instant webhook job."""
    body: dict[str, Any] = {
        "schedule_type": "IMMEDIATE",
        "target": {"type": "HTTP_WEBHOOK", "endpoint": endpoint, "timeout_seconds": 5},
        "payload": {"hello": "world"},
    }
    body.update(fields)
    return body


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.005) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def iter_pages(fetch: Callable[[str | None], dict[str, Any]]) -> Iterator[dict[str, Any]]:
    cursor: str | None = None
    while True:
        page = fetch(cursor)
        yield from page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return


def drive(d: Deployment, rounds: int = 10) -> None:
    """Scan and work until nothing more is due now: a real scanner and worker (webhooks to
    loopback allowed) on the deployment."""
    caller = HttpWebhookCaller(tenant_store(d), NetPolicy(["127.0.0.0/8"]))
    worker = Worker(d, TaskRegistry(), webhook=caller, concurrency=1)
    scanner = Scanner(d, scanner_id="scanner-test")
    try:
        for _ in range(rounds):
            moved = scanner.run_once(d.clock.now_ms())
            worked = worker.run_once(d.clock.now_ms())
            assert worker.wait_idle(10)
            if not moved and not worked:
                break
    finally:
        worker.shutdown()
        caller.close()
