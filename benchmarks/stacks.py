"""Deployments for the benchmarks, each in names of its own, torn down afterwards.

- `sqlite`: the embedded default (a temporary file).
- `postgres-redis`: PostgreSQL store, Redis time index and Redis broker (a schema and key prefix
  of its own on this machine's servers).
- `dynamodb-redis-sqs`: the AWS stack on moto's server, for correctness only (moto is not a speed
  reference).
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

POSTGRES = "postgresql://127.0.0.1:5432/test"
REDIS = "redis://127.0.0.1:6379/0"
STACKS = ("sqlite", "postgres-redis", "dynamodb-redis-sqs")
RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, object]:
    """What a result ran on, and the load then: the machine is shared, so the load says how much."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "loadavg": os.getloadavg(),
        "shared": "yes: other sessions' tests and benchmarks ran at the same time",
    }


def result_stem(name: str) -> Path:
    """`benchmarks/results/<name>-<UTC time>` (made if missing); the caller adds the suffix."""
    RESULTS.mkdir(exist_ok=True)
    return RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


@contextlib.contextmanager
def stack(name: str, redis_url: str = REDIS, **settings: str) -> Iterator[dict[str, str]]:
    """The URLs (and settings) of a fresh deployment; its data is dropped on exit."""
    tag = f"bench{uuid.uuid4().hex[:8]}"
    from jobq.settings import Settings
    from jobq.wiring import init_store

    if name == "sqlite":
        directory = tempfile.mkdtemp(prefix="jobq-bench-")
        urls = {"store": f"sqlite:///{Path(directory) / 'jobq.db'}", **settings}
        init_store(Settings.load(urls, env={}))
        yield urls
        return
    if name == "postgres-redis":
        urls = {
            "store": f"{POSTGRES}?schema={tag}&pool_max=20",
            "index": f"{redis_url}?prefix={tag}",
            "broker": f"{redis_url}?prefix={tag}",
            **settings,
        }
        init_store(Settings.load(urls, env={}))
        try:
            yield urls
        finally:
            import psycopg

            with psycopg.connect(POSTGRES, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{tag}" CASCADE')
            _drop_redis_keys(redis_url, tag)
        return
    if name == "dynamodb-redis-sqs":
        with moto_server() as endpoint:
            host = endpoint.removeprefix("http://")
            urls = {
                "store": f"dynamodb://{tag}?region=us-east-1&endpoint={endpoint}",
                "index": f"{redis_url}?prefix={tag}",
                "broker": f"sqs://testing:testing@{host}?region=us-east-1&prefix={tag}",
                "history": "memory://",
                **settings,
            }
            init_store(Settings.load(urls, env={}))
            try:
                yield urls
            finally:
                _drop_redis_keys(redis_url, tag)
        return
    raise SystemExit(f"unknown stack {name!r}; choose from {', '.join(STACKS)}")


def _drop_redis_keys(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{prefix}*", count=5000))
    for start in range(0, len(keys), 1000):
        client.delete(*keys[start : start + 1000])
    client.close()


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    import os
    import socket

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """A redis-server of the benchmark's own (the peers' harness starts it), so INFO memory counts
    only what jobq stored."""
    from peers.harness import PrivateRedis

    server = PrivateRedis()
    try:
        yield server.url
    finally:
        server.stop()
