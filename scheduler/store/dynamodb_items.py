"""How the DynamoDB store lays out its items: every key, attribute and index entry of the one table.

The design is drawn in docs/dynamodb.md. In short:

- a job is ``PK=JOB#<job_id>`` (tenant ``default``) or ``PK=JOB#<tenant>#<job_id>``, ``SK=META``:
  its JSON document plus the attributes that are queried or changed in place (``status``,
  ``status_reason``, ``version`` and ``updated_ms`` are authoritative over the document);
- a run is ``PK=<its job's PK>, SK=RUN#<nominal_ms, 20 digits>`` with one attribute per field, so
  a run id (which names its job's key, `Run.parse_id`) names its item and reads need no index;
- GSI1 holds runs while the reaper, beat's repair or the dead-letter list need them: leased runs
  by lease expiry, SCHEDULED runs by due time (one partition per priority tier), dead letters by
  nominal time, each spread over 16 shards (``crc32(run_id) % 16``). GSI2 holds ACTIVE jobs by next
  fire time; GSI3 a tenant's jobs by id, for listings;
- idempotency keys and tokens (and their hash lookups) are flat items, one attribute per field;
  an idempotency key carries a TTL so that DynamoDB deletes it some time after it expires.

Values are in the low-level wire form (`as_s`, `as_n`). `gsi1` states which GSI1 entry a run has,
and `plan_gsi1` moves it within a transition's own update expression.
"""

from __future__ import annotations

import json
import zlib
from typing import Any, TypeVar
from urllib.parse import quote

from jobq.dynamodb import SHARDS, Expr, Item
from jobq.dynamodb_schema import TTL_ATTRIBUTE
from jobq.errors import StoreError
from jobq.models import (
    DEFAULT_TENANT,
    LEASED_STATES,
    ApiToken,
    IdempotencyRecord,
    Job,
    JobKey,
    JobStatus,
    Run,
    RunState,
    Transition,
)
from jobq.records import DECODE_ERRORS, corrupt_job, corrupt_run, priority_of

R = TypeVar("R", IdempotencyRecord, ApiToken)

_STR_FIELDS = (
    *("run_id", "job_id", "tenant_id", "state", "lease_owner", "last_error", "prev_run_id", "blocked_by", "trace"),
)
_INT_FIELDS = (
    *("nominal_ms", "due_ms", "attempt", "fence", "version", "lease_expires_ms", "last_heartbeat_ms"),
    *("deadline_ms", "created_ms", "updated_ms", "dispatched_ms", "started_ms", "finished_ms", "handbacks"),
    "attempt_base",
)
#: Every `Run` field, by how it is stored (`priority` as its rank, `result` as JSON text).
RUN_FIELDS = frozenset({*_STR_FIELDS, *_INT_FIELDS, "priority", "dead_letter", "result"})
_UNLEASED_END_STATES = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED})


def shard_of(key: str) -> int:
    """A stable shard in 0..15 (crc32, never Python's per-process `hash`)."""
    return zlib.crc32(key.encode()) % SHARDS


def as_s(value: str) -> dict[str, str]:
    return {"S": value}


def as_n(value: int) -> dict[str, str]:
    return {"N": str(value)}


def tenant_segment(tenant_id: str) -> str:
    return quote(tenant_id, safe="")  # a '#' in a tenant id cannot run into the next key segment


def job_pk(key: JobKey) -> str:
    """The partition of a job and its runs. The tenant ``default`` keeps the form of tables written
    before job ids were scoped by tenant; a job id holds no ``#``, so the forms cannot meet."""
    if key.tenant_id == DEFAULT_TENANT:
        return f"JOB#{key.job_id}"
    return f"JOB#{tenant_segment(key.tenant_id)}#{key.job_id}"


def job_item_key(key: JobKey) -> Item:
    return {"PK": as_s(job_pk(key)), "SK": as_s("META")}


def run_key(run_id: str) -> Item | None:
    """The run's key, derived from its id (`Run.parse_id`); None when the id has another form."""
    parsed = Run.parse_id(run_id)
    if parsed is None:
        return None
    job, nominal = parsed
    return {"PK": as_s(job_pk(job)), "SK": as_s(f"RUN#{nominal:020d}")}


def gsi1(run: Run) -> tuple[str, int] | None:
    """GSI1's (partition, sort) key for the run as it is, or None when it is not indexed. The one
    statement of GSI1 membership: writes set it, transitions keep it (`plan_gsi1`), and the store
    repairs a transition whose expression could not know it."""
    shard = shard_of(run.run_id)
    if run.state in LEASED_STATES:
        return None if run.lease_expires_ms is None else (f"{run.state.value}#{shard}", run.lease_expires_ms)
    if run.state is RunState.SCHEDULED:
        return f"SCHEDULED#{run.priority.value}#{shard}", run.due_ms
    return (f"DEAD#{shard}", run.nominal_ms) if run.dead_letter else None


def run_item(run: Run) -> Item:
    key = run_key(run.run_id)
    if key is None or run.run_id != Run.make_id(run.job_key, run.nominal_ms):
        raise StoreError(f"run id {run.run_id!r} is not what Run.make_id builds for its job and time")
    item: Item = dict(key)
    for name in _STR_FIELDS:
        value = getattr(run, name)
        if value is not None:
            item[name] = as_s(str(value))
    for name in _INT_FIELDS:
        value = getattr(run, name)
        if value is not None:
            item[name] = as_n(value)
    item["priority"] = as_n(run.priority.rank)
    item["dead_letter"] = {"BOOL": run.dead_letter}
    if run.result is not None:
        item["result"] = as_s(json.dumps(run.result))
    # The GSI1 partition this run takes whenever it is SCHEDULED, kept on the item so that a
    # transition can copy it without knowing the run's priority.
    item["GSI1PK_SCHEDULED"] = as_s(f"SCHEDULED#{run.priority.value}#{shard_of(run.run_id)}")
    index = gsi1(run)
    if index is not None:
        item["GSI1PK"], item["GSI1SK"] = as_s(index[0]), as_n(index[1])
    return item


def run_from_item(item: Item) -> Run:
    """The run in `item`; a corrupt marker when the item does not decode."""
    try:
        data: dict[str, Any] = {n: item[n]["S"] for n in _STR_FIELDS if n in item}
        data.update((n, int(item[n]["N"])) for n in _INT_FIELDS if n in item)
        data["priority"] = priority_of(int(item["priority"]["N"]))
        data["dead_letter"] = bool(item.get("dead_letter", {}).get("BOOL", False))
        if "result" in item:
            data["result"] = json.loads(item["result"]["S"])
        return Run.model_validate(data)
    except DECODE_ERRORS as exc:
        return corrupt_run(_salvage(item), exc)


def _salvage(item: Item) -> dict[str, Any]:
    """Each attribute of a run item that converts on its own (for a corrupt marker)."""
    raw: dict[str, Any] = {}
    for name, value in item.items():
        if not isinstance(value, dict) or len(value) != 1:
            continue
        kind, wire = next(iter(value.items()))
        try:
            raw[name] = int(wire) if kind == "N" else wire
        except DECODE_ERRORS:
            continue
    if "priority" in raw:
        raw["priority"] = priority_of(raw["priority"])
    raw.pop("result", None)  # shown only when the item decodes
    return raw


def field_value(name: str, value: Any) -> dict[str, Any] | None:
    """A run field's stored form; None means the attribute is removed."""
    if value is None:
        return None
    if name == "result":
        return as_s(json.dumps(value))
    if name == "dead_letter":
        return {"BOOL": bool(value)}
    return as_n(int(value)) if name in _INT_FIELDS else as_s(str(value))


def job_item(job: Job) -> Item:
    shard = shard_of(job.job_id)
    item: Item = {
        **job_item_key(job.key),
        "doc": as_s(job.model_dump_json()),
        "tenant_id": as_s(job.tenant_id),
        "status": as_s(job.status.value),
        "priority": as_n(job.priority.rank),
        "name": as_s(job.name),
        "version": as_n(job.version),
        "updated_ms": as_n(job.updated_ms),
        "GSI3PK": as_s(f"JOBS#{tenant_segment(job.tenant_id)}#{shard}"),
        "GSI3SK": as_s(job.job_id),
    }
    # GSI2 is sparse on both keys: GSI2PK while ACTIVE, GSI2SK while there is a next fire. A status
    # change then moves GSI2PK alone, without having to know the next fire time.
    if job.next_fire_ms is not None:
        item["next_fire_ms"] = item["GSI2SK"] = as_n(job.next_fire_ms)
    if job.status is JobStatus.ACTIVE:
        item["GSI2PK"] = as_s(f"DUE#{shard}")
    if job.status_reason is not None:
        item["status_reason"] = as_s(job.status_reason)
    return item


def job_from_item(item: Item) -> Job:
    """The job in `item` (its attributes `status`, `status_reason`, `version` and `updated_ms` win
    over the document's); a corrupt marker when it does not decode."""
    try:
        job = Job.model_validate_json(item["doc"]["S"])
        return job.model_copy(
            update={
                "status": JobStatus(item["status"]["S"]),
                "status_reason": item["status_reason"]["S"] if "status_reason" in item else None,
                "version": int(item["version"]["N"]),
                "updated_ms": int(item["updated_ms"]["N"]),
            }
        )
    except DECODE_ERRORS as exc:
        raw = _salvage(item)
        columns = {"job_id": raw.get("GSI3SK"), **raw}
        return corrupt_job(raw.get("doc"), {k: v for k, v in columns.items() if v is not None}, exc)


def flat_item(record: IdempotencyRecord | ApiToken, pk: str, sk: str) -> Item:
    """A record of strings and integers as an item, one attribute per field (None: absent)."""
    item: Item = {"PK": as_s(pk), "SK": as_s(sk)}
    for name, value in record.model_dump().items():
        if value is not None:
            item[name] = as_n(value) if isinstance(value, int) else as_s(value)
    return item


def flat_record(model: type[R], item: Item) -> R:
    fields = {n: int(item[n]["N"]) if "N" in item[n] else item[n]["S"] for n in model.model_fields if n in item}
    return model.model_validate(fields)


def idempotency_pk(tenant_id: str, key: str) -> str:
    return f"IDEM#{tenant_segment(tenant_id)}#{key}"


def idempotency_item(record: IdempotencyRecord) -> Item:
    item = flat_item(record, idempotency_pk(record.tenant_id, record.key), "IDEM")
    item[TTL_ATTRIBUTE] = as_n(record.expires_ms // 1000 + 1)  # DynamoDB deletes it some time after expiry
    return item


def token_hash_key(token_hash: str) -> Item:
    return {"PK": as_s(f"TOKENHASH#{token_hash}"), "SK": as_s("TOKENHASH")}


TOKENS_PK = "TOKENS"  # one partition: tokens are few and rarely written, and listing is one Query
WORKERS_PK = "WORKERS"  # likewise: known_tasks is one Query, never a Scan
TASKS_PK = "TASKS"  # the task catalogue (SK = task name): tasks are few, the catalogue is one Query


def plan_gsi1(e: Expr, t: Transition) -> None:
    """GSI1's keys in the transition's own expression, from what it knows; `DynamoStore._check_gsi1`
    repairs the rare transition that cannot know (a leased state entered without a lease change)."""
    changes = t.changes
    if t.to_state in LEASED_STATES:
        pk = as_s(f"{t.to_state.value}#{shard_of(t.run_id)}")
        if "lease_expires_ms" not in changes:
            e.set("GSI1PK", pk)  # GSI1SK keeps the lease of the leased state it came from
        elif changes["lease_expires_ms"] is None:
            e.set("GSI1PK", None)
            e.set("GSI1SK", None)
        else:
            e.set("GSI1PK", pk)
            e.set("GSI1SK", as_n(int(changes["lease_expires_ms"])))
    elif t.to_state is RunState.SCHEDULED:
        e.copy("GSI1PK", "GSI1PK_SCHEDULED")
        if changes.get("due_ms") is not None:
            e.set("GSI1SK", as_n(int(changes["due_ms"])))
        else:
            e.copy("GSI1SK", "due_ms")
    elif changes.get("dead_letter") is True:
        e.set("GSI1PK", as_s(f"DEAD#{shard_of(t.run_id)}"))
        e.copy("GSI1SK", "nominal_ms")
    elif "dead_letter" in changes or not t.expect <= _UNLEASED_END_STATES:
        e.set("GSI1PK", None)
        e.set("GSI1SK", None)
    # else: an end state to an end state with dead_letter unchanged keeps its index entry.


def plan_gsi2(e: Expr, t: Transition) -> None:
    """A finished run that may hold a result takes GSI2 (``RESULT#<shard>``, by finish time) so
    the reaper can expire it (`DynamoStore.expire_results`); a run that is not finished leaves it.
    A run that succeeded with no value is not indexed: there is nothing to expire."""
    if not t.to_state.terminal:
        if any(s.terminal for s in t.expect):  # a redrive: only a finished run can be in GSI2
            e.set("GSI2PK", None)
            e.set("GSI2SK", None)
    elif t.changes.get("finished_ms") is not None and not ("result" in t.changes and t.changes["result"] is None):
        e.set("GSI2PK", as_s(f"RESULT#{shard_of(t.run_id)}"))
        e.set("GSI2SK", as_n(int(t.changes["finished_ms"])))
