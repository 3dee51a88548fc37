"""Fence guards refuse a stale attempt's write after a newer attempt wrote, on each store."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
from services import require_postgres, require_redis

from jobq.contrib.fencing import dynamodb_fenced, redis_fenced_set, sql_guard


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, str]]:
    """A connection and a guard table of this test's own."""
    table = f"fences_{uuid.uuid4().hex[:8]}"
    if request.param == "sqlite":
        c = sqlite3.connect(tmp_path / "app.db")
        yield c, table
        c.close()
        return
    import psycopg

    c = psycopg.connect(require_postgres(), autocommit=False)
    yield c, table
    c.rollback()
    c.execute(f"DROP TABLE IF EXISTS {table}")
    c.commit()
    c.close()


def test_sql_guard_refuses_an_older_fence_after_a_newer_one_wrote(db: tuple[Any, str]) -> None:
    conn, table = db
    assert sql_guard(conn, "job_1:100", 3, table=table)
    conn.commit()
    assert not sql_guard(conn, "job_1:100", 2, table=table)
    conn.commit()
    assert sql_guard(conn, "job_1:100", 3, table=table)  # the same attempt may write again
    assert sql_guard(conn, "job_1:100", 5, table=table)
    conn.commit()
    assert not sql_guard(conn, "job_1:100", 4, table=table)


def test_sql_guards_are_per_run_and_resource(db: tuple[Any, str]) -> None:
    conn, table = db
    assert sql_guard(conn, "job_1:100", 9, table=table)
    assert sql_guard(conn, "job_1:200", 1, table=table)
    assert sql_guard(conn, "job_1:100", 1, resource="email", table=table)
    conn.commit()


def test_a_refused_guard_rolls_back_with_the_guarded_write(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "app.db")
    conn.execute("CREATE TABLE charges (run_id TEXT, amount INT)")
    with conn:
        assert sql_guard(conn, "r", 2)
        conn.execute("INSERT INTO charges VALUES ('r', 10)")
    with conn:
        if sql_guard(conn, "r", 1):
            conn.execute("INSERT INTO charges VALUES ('r', 99)")
    assert conn.execute("SELECT amount FROM charges").fetchall() == [(10,)]
    conn.close()


@pytest.fixture(params=["redis", "fakeredis"])
def r(request: pytest.FixtureRequest) -> Iterator[Any]:
    client = redis.Redis.from_url(require_redis()) if request.param == "redis" else fakeredis.FakeRedis()
    yield client
    client.close()


def test_redis_fenced_set_refuses_an_older_fence(r: Any) -> None:
    key = f"jobq-test:fence:{uuid.uuid4().hex}"
    try:
        assert redis_fenced_set(r, key, "first", 4, ttl_s=60)
        assert not redis_fenced_set(r, key, "stale", 3)
        assert r.hget(key, "value") == b"first"
        assert redis_fenced_set(r, key, "newer", 6)
        assert r.hget(key, "value") == b"newer"
        assert 0 < r.ttl(key) <= 60
    finally:
        r.delete(key)


def test_dynamodb_fenced_adds_a_condition_and_keeps_the_caller_s() -> None:
    request = {
        "TableName": "t",
        "Key": {"pk": {"S": "a"}},
        "UpdateExpression": "SET amount = :a",
        "ConditionExpression": "attribute_exists(pk)",
        "ExpressionAttributeValues": {":a": {"N": "1"}},
    }
    fenced = dynamodb_fenced(7, request)
    assert fenced["ConditionExpression"] == (
        "(attribute_exists(pk)) AND (attribute_not_exists(#jobq_f) OR #jobq_f <= :jobq_fence)"
    )
    assert fenced["UpdateExpression"] == "SET #jobq_f = :jobq_fence, amount = :a"
    assert fenced["ExpressionAttributeValues"] == {":a": {"N": "1"}, ":jobq_fence": {"N": "7"}}
    assert request["ConditionExpression"] == "attribute_exists(pk)"  # the caller's dict is untouched
