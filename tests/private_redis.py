"""A redis-server of a test's own on a spare port, which the test may stop and start again.

Fault tests stop this one, never the machine's shared Redis on 6379.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from services import free_port, have_binary, port_open, unavailable


class PrivateRedis:
    def __init__(self, workdir: Path) -> None:
        if not have_binary("redis-server"):
            unavailable("redis-server is not installed")
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        # No persistence: a restart comes back empty, as a lost broker or a flushed index would.
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not port_open("127.0.0.1", self.port):
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None
