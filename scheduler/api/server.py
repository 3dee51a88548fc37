"""Serving the API with uvicorn: as its own process (`jobq api`) or in a thread (`jobq dev`, tests).

`jobq api --workers N` runs N uvicorn worker processes. Each builds its app from the settings
the command resolved, passed down in `JOBQ_API_SETTINGS` (JSON), so flags reach the workers
too; each worker has its own connections and its own rate-limit buckets.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from jobq import logs, tracing
from jobq.api.app import create_app
from jobq.daemons.base import Daemon
from jobq.deployment import Deployment
from jobq.settings import Settings

SETTINGS_ENV = "JOBQ_API_SETTINGS"
_GRACE_S = 10


def app_from_env() -> FastAPI:
    """The uvicorn factory of `jobq api`: settings from `JOBQ_API_SETTINGS`, a deployment of its own."""
    text = os.environ.get(SETTINGS_ENV)
    settings = Settings.model_validate_json(text) if text else Settings.load()
    logs.configure(settings.log_level, settings.log_format)
    tracing.configure(settings.tracing, "jobq-api")  # checked by `jobq api` before it started us
    from jobq.wiring import connect  # a uvicorn worker process is its own composition root

    return create_app(connect(settings), close_deployment=True, register=True)


def serve(settings: Settings) -> None:
    """Run `jobq api` in the foreground until SIGTERM or Ctrl-C (uvicorn handles both gracefully)."""
    os.environ[SETTINGS_ENV] = settings.model_dump_json()
    logging.getLogger("jobq.api").info(
        "jobq api on http://%s:%d with %d worker(s)", settings.api_host, settings.api_port, settings.api_workers
    )
    options: dict[str, Any] = {
        "factory": True,
        "host": settings.api_host,
        "port": settings.api_port,
        "log_config": None,  # jobq's own log configuration; the access log is jobq.api's
        "access_log": False,
        "server_header": False,
        "proxy_headers": False,  # X-Forwarded-* is believed only as `api_trust_forwarded_proto` says
        "timeout_graceful_shutdown": _GRACE_S,
        "h11_max_incomplete_event_size": settings.api_max_header_bytes + 4096,
    }
    if settings.api_workers > 1:
        uvicorn.run("jobq.api.server:app_from_env", workers=settings.api_workers, **options)
    else:
        _QuietExitServer(uvicorn.Config("jobq.api.server:app_from_env", **options)).run()


class _QuietExitServer(uvicorn.Server):
    """uvicorn re-raises SIGTERM/SIGINT after a graceful shutdown, so the process would die of the
    signal; `jobq api` exits 0 after a graceful shutdown, like every other jobq daemon."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        def on_signal(signum: int, _frame: FrameType | None) -> None:
            if self.should_exit and signum == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: stop waiting for open connections
            self.should_exit = True

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket (port 0 picks a free one); raises OSError when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=2048)


class ApiServer(Daemon):
    """The API served from a thread of another process, on a socket bound up front (so a taken
    port is known before anything starts). As a `Daemon`, `jobq dev` runs and stops it with the
    other roles, before the deployment is closed."""

    name = "api"

    def __init__(
        self, deployment: Deployment, app: FastAPI | None = None, *, sock: socket.socket | None = None
    ) -> None:
        super().__init__(deployment)
        self.sock = sock or listen(self.settings.api_host, self.settings.api_port)
        host, port = self.sock.getsockname()[:2]
        self.url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
        config = uvicorn.Config(
            app or create_app(deployment),
            log_config=None,
            access_log=False,
            server_header=False,
            proxy_headers=False,
            timeout_graceful_shutdown=_GRACE_S,
            lifespan="on",
        )
        self.server = uvicorn.Server(config)

    def run_once(self, now_ms: int) -> int:
        return 0

    def run_forever(self, stop: threading.Event) -> None:
        """Serve until `stop` is set, then finish in-flight requests (up to 10 s) and return."""

        def watch() -> None:
            stop.wait()
            self.server.should_exit = True

        threading.Thread(target=watch, name="jobq-api-stop", daemon=True).start()
        self.log.info("api serving on %s", self.url)
        self.server.run(sockets=[self.sock])
        self.sock.close()
        self.log.info("api stopped")

    def start_thread(self) -> tuple[threading.Thread, threading.Event]:
        """Serve from a new thread (for tests); set the returned event to stop it."""
        stop = threading.Event()
        thread = threading.Thread(target=self.run_forever, args=(stop,), name="jobq-api", daemon=True)
        thread.start()
        return thread, stop

    @property
    def started(self) -> bool:
        return bool(self.server.started)
