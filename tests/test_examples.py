"""Every example runs, as its docstring says, with one command."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from stacks import self_hosted_cleanups

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def _run_example(module: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_the_self_hosted_deployment_example_runs_every_kind_of_job() -> None:
    name = f"ex{uuid.uuid4().hex[:8]}"
    cleanups = self_hosted_cleanups(name)
    try:
        result = _run_example("examples.selfhosted", {"JOBQ_EXAMPLE_NAME": name})
    finally:
        for cleanup in cleanups:
            cleanup()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "flaky (fails twice)      SUCCEEDED at attempt 3" in result.stdout
    assert "broken (dead-lettered)   FAILED" in result.stdout
    assert "all jobs ran as expected" in result.stdout
    assert f"removed PostgreSQL schema {name}" in result.stdout
    assert f"removed RabbitMQ queues {name}-*" in result.stdout
    assert _leftovers(name) == ([], [])


def _leftovers(name: str) -> tuple[list[str], list[bytes]]:
    """The schema and Redis keys a self-hosted example named `name` left behind."""
    import psycopg
    import redis
    from services import require_postgres, require_redis

    with psycopg.connect(require_postgres()) as conn:
        schemas = [r[0] for r in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname = %s", [name])]
    client = redis.Redis.from_url(require_redis())
    keys = list(client.scan_iter(match=f"{name}*"))
    client.close()
    return schemas, keys


def test_the_aws_deployment_example_runs_on_moto_and_redis() -> None:
    from stacks import _redis_prefix_cleanup

    name = f"ex-{uuid.uuid4().hex[:8]}"
    try:
        result = _run_example("examples.aws", {"JOBQ_EXAMPLE_NAME": name})
    finally:
        _redis_prefix_cleanup(name)()
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"DynamoDB table {name!r}: created" in result.stdout
    assert "flaky (fails twice)      SUCCEEDED at attempt 3" in result.stdout
    assert "all jobs ran as expected" in result.stdout
