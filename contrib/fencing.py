"""Fence guards: make a downstream write conditional on the attempt's fence, so a stale attempt
(a worker that lost its lease but is still running) cannot overwrite a newer one's effect.

Fences are per run, so guards are keyed by run id (and optionally a resource within the run).
A write carrying fence f is accepted unless a write with a larger fence was accepted before;
the same fence may write again (an attempt retrying its own write is idempotent).

    def charge(ctx: TaskContext, conn) -> None:        # inside the task, in your transaction
        with conn:
            if not sql_guard(conn, ctx.run_id, ctx.fence):
                raise Fail("a newer attempt already wrote")
            conn.execute("INSERT INTO charges ...")
"""

from __future__ import annotations

from typing import Any, Protocol

SQL_FENCES_DDL = """
CREATE TABLE IF NOT EXISTS {table} (
    guard_key TEXT PRIMARY KEY,
    fence     BIGINT NOT NULL
)
"""

# ON CONFLICT … DO UPDATE … WHERE: SQLite 3.24+ and PostgreSQL 9.5+. The row is written in the
# caller's transaction, so the guard and the guarded write commit or roll back together, and a
# concurrent writer of the same key waits on the row lock.
_SQL_GUARD = """
INSERT INTO {table} (guard_key, fence) VALUES ({p}, {p})
ON CONFLICT (guard_key) DO UPDATE SET fence = excluded.fence WHERE excluded.fence >= {table}.fence
"""


class _Cursor(Protocol):
    rowcount: int

    def execute(self, sql: str, params: Any = ..., /) -> Any: ...


class _Connection(Protocol):
    def cursor(self) -> Any: ...


def sql_guard(
    conn: _Connection, run_id: str, fence: int, *, resource: str = "", table: str = "jobq_fences", paramstyle: str = ""
) -> bool:
    """Record `fence` for (run_id, resource) in the caller's open transaction; False when a larger
    fence was recorded before (the caller must then not write). Works with sqlite3 and psycopg.

    `paramstyle` is "qmark" (sqlite3) or "format" (psycopg); by default it is read off the
    connection's module."""
    style = paramstyle or _paramstyle(conn)
    placeholder = "?" if style == "qmark" else "%s"
    cursor = conn.cursor()
    cursor.execute(SQL_FENCES_DDL.format(table=table))
    cursor.execute(_SQL_GUARD.format(table=table, p=placeholder), (_key(run_id, resource), fence))
    return bool(cursor.rowcount == 1)


def _paramstyle(conn: object) -> str:
    module = type(conn).__module__.split(".")[0]
    return "qmark" if module in ("sqlite3", "_sqlite3") else "format"


def _key(run_id: str, resource: str) -> str:
    return f"{run_id}|{resource}" if resource else run_id


# KEYS[1]: the guarded key (a hash: fence, value). ARGV: fence, value, ttl_s (0: none).
# Returns 1 when written, 0 when a larger fence holds the key.
REDIS_FENCED_SET = """
local current = tonumber(redis.call('HGET', KEYS[1], 'fence') or '-1')
local fence = tonumber(ARGV[1])
if fence < current then
  return 0
end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
if tonumber(ARGV[3]) > 0 then
  redis.call('EXPIRE', KEYS[1], ARGV[3])
end
return 1
"""


def redis_fenced_set(client: Any, key: str, value: str | bytes, fence: int, *, ttl_s: int = 0) -> bool:
    """Set `key` (stored as a hash of fence and value) unless a larger fence already wrote it.
    Atomic: one Lua script on one key, so it works on Redis Cluster."""
    return bool(client.eval(REDIS_FENCED_SET, 1, key, fence, value, ttl_s))


def dynamodb_fenced(fence: int, request: dict[str, Any], *, attribute: str = "jobq_fence") -> dict[str, Any]:
    """Add a fence condition to a DynamoDB `put_item`/`update_item` request: it succeeds only if the
    item has no fence yet or a fence no larger than this one (a stale writer gets
    ConditionalCheckFailedException). For `put_item`, put `attribute` in the item yourself;
    for `update_item`, this adds `SET attribute = :jobq_fence`."""
    condition = "attribute_not_exists(#jobq_f) OR #jobq_f <= :jobq_fence"
    out = dict(request)
    existing = out.get("ConditionExpression")
    out["ConditionExpression"] = f"({existing}) AND ({condition})" if existing else condition
    out["ExpressionAttributeNames"] = {**out.get("ExpressionAttributeNames", {}), "#jobq_f": attribute}
    out["ExpressionAttributeValues"] = {**out.get("ExpressionAttributeValues", {}), ":jobq_fence": {"N": str(fence)}}
    if "UpdateExpression" in out:
        update = out["UpdateExpression"]
        out["UpdateExpression"] = (
            update.replace("SET ", "SET #jobq_f = :jobq_fence, ", 1)
            if "SET " in update
            else f"SET #jobq_f = :jobq_fence {update}"
        )
    return out
