"""The real services tests talk to: found on this machine, else skipped locally and failed in CI."""

from __future__ import annotations

import os
import socket
import subprocess
from typing import NoReturn

import pytest

REDIS_URL = os.environ.get("JOBQ_TEST_REDIS", "redis://127.0.0.1:6379/0")
POSTGRES_DSN = os.environ.get("JOBQ_TEST_POSTGRES", "postgresql://127.0.0.1:5432/test")
AMQP_URL = os.environ.get("JOBQ_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672//")


def unavailable(reason: str) -> NoReturn:
    """Skip locally; in CI (CI=true) a missing service is a failure, never a silent skip."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"required service unavailable in CI: {reason}")
    pytest.skip(reason)


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_redis() -> str:
    if not port_open("127.0.0.1", 6379):
        unavailable("Redis is not running on 127.0.0.1:6379")
    return REDIS_URL


def require_postgres() -> str:
    if not port_open("127.0.0.1", 5432):
        unavailable("PostgreSQL is not running on 127.0.0.1:5432")
    return POSTGRES_DSN


def require_rabbitmq() -> str:
    if not port_open("127.0.0.1", 5672):
        unavailable("RabbitMQ is not running on 127.0.0.1:5672")
    return AMQP_URL


def have_binary(name: str) -> bool:
    return subprocess.run(["which", name], capture_output=True, check=False).returncode == 0
