"""Upgrading a DynamoDB table written before job ids were scoped by tenant (what `jobq init` runs).

The previous version kept every job at ``PK=JOB#<job_id>`` and named its runs ``job_id:ms``,
whatever the tenant. The tenant ``default`` keeps exactly that form, so its items need nothing.
A job of another tenant now lives at ``JOB#<tenant>#<job_id>`` and its runs are
``tenant/job_id:ms``: `move_legacy_jobs` finds the jobs of other tenants still at the old key and
moves each, with its runs, to the new one. Items are copied as they are (so a record that does
not decode is moved undecoded), with the new key, run ids (and the references to them:
`prev_run_id`, `blocked_by`, the job's `last_run_id`) and GSI1 shards; then the old items are
deleted. Idempotent: a move cut short is finished by the next run. See docs/dynamodb.md for what
happens to runs in flight meanwhile.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from jobq.dynamodb import SHARDS, Expr, Item
from jobq.models import DEFAULT_TENANT, JobKey, Run
from jobq.store.dynamodb_items import as_s, job_pk, shard_of

if TYPE_CHECKING:
    from jobq.store.dynamodb import DynamoStore

_RUN_REFERENCES = ("prev_run_id", "blocked_by")


def move_legacy_jobs(store: DynamoStore) -> int:
    """Move every job of a tenant other than ``default`` found at its pre-tenant key; returns how
    many were moved. Scans the table (16 segments in parallel): run it with the daemons stopped."""
    table = store.table
    e = Expr()
    e.when("SK", "=", as_s("META"))
    e.conditions.append(f"begins_with({e.n('PK')}, {e.v(as_s('JOB#'))})")
    e.when("tenant_id", "<>", as_s(DEFAULT_TENANT))
    scan = e.finish(TotalSegments=SHARDS, **e.take_filter())
    segments = table.parallel(lambda s: table.query_all(None, Segment=s, **scan), list(range(SHARDS)))
    legacy = [item for rows in segments for item in rows if item["PK"]["S"] != job_pk(_key(item))]
    for item in legacy:
        _move(store, item)
    return len(legacy)


def _key(job_item: Item) -> JobKey:
    return JobKey(job_item["tenant_id"]["S"], job_item["GSI3SK"]["S"])


def _move(store: DynamoStore, job_item: Item) -> None:
    table = store.table
    key = _key(job_item)
    old_pk, new_pk = job_item["PK"]["S"], job_pk(key)
    e = Expr()
    request = e.finish(KeyConditionExpression=f"{e.n('PK')} = {e.v(as_s(old_pk))}", ConsistentRead=True)
    items = table.query_all(None, **request)
    renamed: dict[str, str] = {}
    for item in items:
        old_id: str | None = item.get("run_id", {}).get("S")
        parsed = None if old_id is None else Run.parse_id(old_id)
        if old_id is not None and parsed is not None and parsed[0].job_id == key.job_id:
            renamed[old_id] = Run.make_id(key, parsed[1])
    moved = [_moved(item, new_pk, renamed) for item in items]
    table.parallel(lambda item: table.call("put_item", TableName=table.name, Item=item), moved)

    def delete(item: Item) -> None:
        table.call("delete_item", TableName=table.name, Key={"PK": item["PK"], "SK": item["SK"]})

    # The job item last: while it is there, the next `jobq init` finds the move unfinished.
    table.parallel(delete, [item for item in items if item["SK"]["S"] != "META"])
    delete(job_item)


def _moved(item: Item, new_pk: str, renamed: dict[str, str]) -> Item:
    """`item` under `new_pk`, its run ids renamed and its GSI1 shards recomputed for the new id."""
    out: Item = {**item, "PK": as_s(new_pk)}
    run_id = item.get("run_id", {}).get("S")
    if run_id in renamed:
        new_id = renamed[run_id]
        out["run_id"] = as_s(new_id)
        for name in ("GSI1PK", "GSI1PK_SCHEDULED"):  # `<state or tier...>#<shard of the run id>`
            if "S" in item.get(name, {}):
                head = item[name]["S"].rpartition("#")[0]
                out[name] = as_s(f"{head}#{shard_of(new_id)}")
    for name in _RUN_REFERENCES:
        value = item.get(name, {}).get("S")
        if value in renamed:
            out[name] = as_s(renamed[value])
    if item["SK"]["S"] == "META" and "S" in item.get("doc", {}):
        out["doc"] = as_s(_renamed_doc(item["doc"]["S"], renamed))
    return out


def _renamed_doc(doc: str, renamed: dict[str, str]) -> str:
    try:
        parsed: Any = json.loads(doc)
    except ValueError:
        return doc  # a document that does not decode is moved as it is
    if isinstance(parsed, dict) and parsed.get("last_run_id") in renamed:
        parsed["last_run_id"] = renamed[parsed["last_run_id"]]
        return json.dumps(parsed, separators=(",", ":"))
    return doc
