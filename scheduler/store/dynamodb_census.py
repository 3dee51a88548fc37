"""The daemon registry and the run census on the DynamoDB store's table.

Registry: one partition, ``PK=DAEMONS``, ``SK=<daemon id>``, the record as JSON in ``doc``, its
expiry in ``expires_ms`` and in the table's TTL attribute (an hour later: DynamoDB then deletes
entries of daemons that died without deregistering). Listing is one strongly consistent Query.

Census: DynamoDB has no cheap COUNT, and terminal runs are in no index at all, so the census
*samples*: it reads GSI1's partitions of the first `shards` of the 16 shards (SCHEDULED by tier,
CLAIMED, DISPATCHED, RUNNING, dead letters), at most `CAP` items each, keys and a few attributes
only, and scales the counts by 16 / `shards`. A run's shard is a hash of its id, so the sample is
uniform; oldest times are the oldest seen in the sample. SUCCEEDED, CANCELLED and FAILED runs that
are not dead letters are not counted (`Census.exact` is False).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jobq.dynamodb import SHARDS, DynamoTable, Expr, Item
from jobq.dynamodb_schema import TTL_ATTRIBUTE
from jobq.models import PRIORITIES_BY_RANK, Priority, RunState
from jobq.registry import Census, DaemonRecord, TierFigures, decode_daemons, expiring
from jobq.store.dynamodb_items import as_n, as_s

DAEMONS_PK = "DAEMONS"
CAP = 5_000  # items read per sampled partition: beyond this a count is a floor
_TTL_AFTER_S = 3_600  # DynamoDB deletes an entry this long after it expired (and some time later still)
_FIELDS = ("priority", "due_ms", "dispatched_ms", "updated_ms")


def heartbeat(table: DynamoTable, records: Sequence[DaemonRecord], ttl_ms: int) -> None:
    def put(record: DaemonRecord) -> None:
        held = expiring(record, ttl_ms)
        item = {
            "PK": as_s(DAEMONS_PK),
            "SK": as_s(record.daemon_id),
            "doc": as_s(held.to_json()),
            "expires_ms": as_n(held.expires_ms),
            TTL_ATTRIBUTE: as_n(held.expires_ms // 1000 + _TTL_AFTER_S),
        }
        table.call("put_item", TableName=table.name, Item=item)

    table.parallel(put, list(records))


def live_daemons(table: DynamoTable, now_ms: int) -> list[DaemonRecord]:
    e = Expr()
    request = e.finish(
        KeyConditionExpression=f"{e.n('PK')} = {e.v(as_s(DAEMONS_PK))}",
        ProjectionExpression=f"{e.n('doc')}, {e.n('expires_ms')}",
        ConsistentRead=True,
    )
    items = table.query_all(None, **request)
    return decode_daemons(i["doc"]["S"] for i in items if "doc" in i and int(i["expires_ms"]["N"]) > now_ms)


def deregister(table: DynamoTable, daemon_ids: Sequence[str]) -> None:
    def delete(daemon_id: str) -> None:
        key = {"PK": as_s(DAEMONS_PK), "SK": as_s(daemon_id)}
        table.call("delete_item", TableName=table.name, Key=key)

    table.parallel(delete, list(daemon_ids))


def census(table: DynamoTable, now_ms: int, shards: int) -> Census:
    shards = max(1, min(SHARDS, shards))
    partitions = [
        f"{kind}#{shard}"
        for shard in range(shards)
        for kind in (*(f"SCHEDULED#{p.value}" for p in PRIORITIES_BY_RANK), "CLAIMED", "DISPATCHED", "RUNNING", "DEAD")
    ]
    e = Expr()
    projection = ", ".join(e.n(name) for name in _FIELDS)
    base = e.finish(IndexName="GSI1", KeyConditionExpression=f"{e.n('GSI1PK')} = :pk", ProjectionExpression=projection)
    values = base.pop("ExpressionAttributeValues", {})

    def read(partition: str) -> list[Item]:
        return table.query_all(CAP, ExpressionAttributeValues={**values, ":pk": as_s(partition)}, **base)

    scale = SHARDS / shards
    states: dict[RunState, float] = {}
    dead = 0.0
    tiers: dict[Priority, list[Any]] = {p: [0.0, None, 0.0, None] for p in Priority}
    for partition, items in zip(partitions, table.parallel(read, partitions), strict=True):
        kind = partition.split("#")[0]
        if kind == "DEAD":
            dead += len(items) * scale
            states[RunState.FAILED] = states.get(RunState.FAILED, 0) + len(items) * scale
            continue
        state = RunState(kind)
        states[state] = states.get(state, 0) + len(items) * scale
        for item in items:
            tier = PRIORITIES_BY_RANK[_int(item, "priority") or 0]
            figures = tiers[tier]
            due = _int(item, "due_ms")
            if state in (RunState.SCHEDULED, RunState.CLAIMED) and due is not None and due <= now_ms:
                figures[0] += scale
                figures[1] = due if figures[1] is None else min(figures[1], due)
            if state is RunState.DISPATCHED:
                at = _int(item, "dispatched_ms") or _int(item, "updated_ms")
                figures[2] += scale
                if at is not None:
                    figures[3] = at if figures[3] is None else min(figures[3], at)
    return Census(
        at_ms=now_ms,
        states={s: round(n) for s, n in states.items() if n},
        dead_letters=round(dead),
        tiers={p: TierFigures(round(f[0]), f[1], round(f[2]), f[3]) for p, f in tiers.items()},
        exact=False,
    )


def _int(item: Item, name: str) -> int | None:
    value = item.get(name)
    return None if value is None or "N" not in value else int(value["N"])
