"""moto's real HTTP server for tests: AWS APIs (SQS, DynamoDB, S3, Firehose, ...) on a local port.

One server per test process, started on first use in a child process (so pytest's
warnings-as-errors and the GIL of the tests never reach it) and killed when the process exits.
Two ways in:

- the `moto` fixture, for tests: `from moto_server import MotoServer, moto  # noqa: F401` in a test
  module, then take `moto: MotoServer` and make clients with `moto.client("dynamodb")`. After each
  test its clients are closed and the server is reset (POST /moto-api/reset), so tests never see
  each other's tables, buckets or queues;
- `shared_moto_server()`, for code that cannot take fixtures (a contract suite's backend factory);
  such code cleans up what it creates, or calls `reset()`.

Without moto's server extras (flask, flask-cors) tests skip locally and fail in CI.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
from services import free_port, unavailable

REGION = "us-east-1"
ACCESS_KEY = "testing"
SECRET_KEY = "testing"

_START_TIMEOUT_S = 30.0


@dataclass
class MotoServer:
    """A running `python -m moto.server` child process."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    _clients: list[Any] = field(default_factory=list)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client_kwargs(self) -> dict[str, str]:
        """Arguments for `boto3.client(service, **kwargs)` that reach this server."""
        return {
            "endpoint_url": self.endpoint_url,
            "region_name": REGION,
            "aws_access_key_id": ACCESS_KEY,
            "aws_secret_access_key": SECRET_KEY,
        }

    def client(self, service: str) -> Any:
        """A boto3 client for `service` on this server; the `moto` fixture closes it after the test."""
        import boto3

        client = boto3.client(service, **self.client_kwargs())
        self._clients.append(client)
        return client

    def close_clients(self) -> None:
        while self._clients:
            self._clients.pop().close()

    def sqs_url(self) -> str:
        """A kombu broker URL for SQS on this server."""
        return f"sqs://{ACCESS_KEY}:{SECRET_KEY}@127.0.0.1:{self.port}?region={REGION}"

    def reset(self) -> None:
        """Forget every resource of every service."""
        request = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def stop(self) -> None:
        # SIGKILL: moto keeps nothing worth flushing, and after SIGTERM it takes ~3 s to exit.
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)

    @classmethod
    def start(cls) -> MotoServer:
        """Start a server on a free port and wait until it answers; skips (or fails in CI) when
        moto's server cannot run here."""
        for module in ("moto", "flask", "flask_cors"):
            if importlib.util.find_spec(module) is None:
                unavailable(f"moto server needs {module}: pip install 'moto[server]' (or flask, flask-cors)")
        log_file: IO[bytes] = tempfile.NamedTemporaryFile(prefix="moto-server-", suffix=".log", delete=False)  # noqa: SIM115
        with log_file:
            # A port found free may be taken before the child binds it: try a few.
            for _ in range(3):
                port = free_port()
                process = subprocess.Popen(
                    [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                )
                server = cls(port, process, Path(log_file.name))
                if server._wait_ready():
                    return server
                server.stop()
        unavailable(f"moto server did not start; see {log_file.name}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
                self.reset()
                return True
            time.sleep(0.1)
        return False


_shared: MotoServer | None = None
_shared_lock = threading.Lock()


def shared_moto_server() -> MotoServer:
    """This process's server, started on first use and killed at exit."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared.process.poll() is not None:
            _shared = MotoServer.start()
            atexit.register(_shared.stop)
        return _shared


@pytest.fixture
def moto() -> Iterator[MotoServer]:
    """The shared server; after the test, the clients it made are closed and it is reset."""
    server = shared_moto_server()
    yield server
    server.close_clients()
    server.reset()
