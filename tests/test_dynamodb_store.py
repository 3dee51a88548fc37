"""The DynamoDB store's own design, against moto's server: item layout, sparse indexes, shard fan-out,
conditional writes, transactions, error translation, table creation and its printed definitions.

The JobStore and TenantStore behaviour is the contract suites' business (tests/contract); these
tests read the table underneath to check that the store keeps the layout docs/dynamodb.md draws.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from factories import T0, key, make_job, make_run
from moto_server import ACCESS_KEY, REGION, SECRET_KEY, MotoServer, moto  # noqa: F401 - the fixture
from services import free_port, have_binary

from jobq.dynamodb import DynamoConfig, render_definition, table_definition
from jobq.errors import ConfigError, DuplicateJob, IdempotencyConflict, StoreError, StoreUnavailable
from jobq.models import RUN_FIELDS as STORED_RUN_FIELDS
from jobq.models import IdempotencyRecord, JobStatus, Priority, RunState, Transition
from jobq.ports import JobQuery, RunQuery
from jobq.store.dynamodb import DynamoStore
from jobq.store.dynamodb_items import RUN_FIELDS, shard_of

S = RunState
Item = dict[str, Any]


def _url(server: MotoServer, table: str, **params: str) -> str:
    query = {
        "region": REGION,
        "endpoint": server.endpoint_url,
        "aws_access_key_id": ACCESS_KEY,
        "aws_secret_access_key": SECRET_KEY,
        **params,
    }
    return f"dynamodb://{table}?" + "&".join(f"{k}={v}" for k, v in query.items())


@pytest.fixture
def make_store(moto: MotoServer) -> Iterator[Callable[..., DynamoStore]]:  # noqa: F811
    """Stores on fresh tables (created unless told not to); closed after the test, whose tables the
    `moto` fixture then drops with its reset."""
    stores: list[DynamoStore] = []

    def make(table: str | None = None, *, create: bool = True, **params: str) -> DynamoStore:
        store = DynamoStore.from_url(_url(moto, table or f"jobq-{uuid.uuid4().hex[:10]}", **params))
        stores.append(store)
        if create:
            store.create_table()
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def store(make_store: Callable[..., DynamoStore]) -> DynamoStore:
    return make_store()


def raw(store: DynamoStore, pk: str, sk: str) -> Item:
    """The item as stored, read past the store."""
    item: Item = store.table.client.get_item(
        TableName=store.table.name, Key={"PK": {"S": pk}, "SK": {"S": sk}}, ConsistentRead=True
    ).get("Item", {})
    return item


def run_sk(nominal_ms: int) -> str:
    return f"RUN#{nominal_ms:020d}"


def gsi(store: DynamoStore, index: str, partition: str) -> list[str]:
    """The PKs/SKs in one partition of a GSI, queried directly."""
    response = store.table.client.query(
        TableName=store.table.name,
        IndexName=index,
        KeyConditionExpression="#pk = :pk",
        ExpressionAttributeNames={"#pk": f"{index}PK"},
        ExpressionAttributeValues={":pk": {"S": partition}},
    )
    return [f"{i['PK']['S']}/{i['SK']['S']}" for i in response["Items"]]


class Calls:
    """Every DynamoDB call a store's client makes, with the error code of the failed ones."""

    def __init__(self, store: DynamoStore) -> None:
        self.ops: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.threads: set[str] = set()
        self.indexes: Counter[str] = Counter()
        events = store.table.client.meta.events
        events.register("before-parameter-build.dynamodb", self._before)
        events.register("after-call.dynamodb", self._after)

    def _before(self, model: Any, params: dict[str, Any], **_: Any) -> None:
        self.ops[model.name] += 1
        self.threads.add(threading.current_thread().name)
        if "IndexName" in params:
            self.indexes[params["IndexName"]] += 1

    def _after(self, model: Any, parsed: dict[str, Any], **_: Any) -> None:
        code = parsed.get("Error", {}).get("Code")
        if code:
            self.errors[f"{model.name}:{code}"] += 1


# -- items --------------------------------------------------------------------------------------


def test_a_job_is_a_meta_item_with_its_queried_attributes_and_index_keys(store: DynamoStore) -> None:
    store.create_job(make_job("job_1", name="billing.run", priority=Priority.HIGH, next_fire_ms=T0 + 5), [])
    item = raw(store, "JOB#job_1", "META")
    shard = shard_of("job_1")
    assert json.loads(item["doc"]["S"])["job_id"] == "job_1"
    assert {k: v for k, v in item.items() if k not in ("PK", "SK", "doc")} == {
        "tenant_id": {"S": "default"},
        "status": {"S": "ACTIVE"},
        "priority": {"N": "1"},  # the rank: HIGH
        "name": {"S": "billing.run"},
        "version": {"N": "0"},
        "updated_ms": {"N": str(T0)},
        "next_fire_ms": {"N": str(T0 + 5)},
        "GSI2PK": {"S": f"DUE#{shard}"},
        "GSI2SK": {"N": str(T0 + 5)},
        "GSI3PK": {"S": f"JOBS#default#{shard}"},
        "GSI3SK": {"S": "job_1"},
    }


def test_a_run_lives_in_its_jobs_partition_with_every_field_as_an_attribute(store: DynamoStore) -> None:
    run = make_run("job_1", T0, last_error="boom", result={"ok": [1, 2]}, deadline_ms=T0 + 60_000)
    store.add_runs([run])
    item = raw(store, "JOB#job_1", run_sk(T0))
    assert item["run_id"] == {"S": f"job_1:{T0}"}
    assert (item["state"], item["fence"], item["priority"]) == ({"S": "SCHEDULED"}, {"N": "0"}, {"N": "2"})
    assert (item["dead_letter"], item["deadline_ms"]) == ({"BOOL": False}, {"N": str(T0 + 60_000)})
    assert json.loads(item["result"]["S"]) == {"ok": [1, 2]}
    assert "lease_owner" not in item  # None is an absent attribute, never a NULL
    shard = shard_of(run.run_id)
    assert (item["GSI1PK"], item["GSI1SK"]) == ({"S": f"SCHEDULED#DEFAULT#{shard}"}, {"N": str(T0)})


def test_every_run_field_has_a_stored_form() -> None:
    assert set(STORED_RUN_FIELDS) == RUN_FIELDS  # a new field must be taught to the item codec


def test_run_keys_sort_by_nominal_time_whatever_the_number_of_digits(store: DynamoStore) -> None:
    store.add_runs([make_run("job_1", n) for n in (9, 10, 1_000_000)])
    page = store.list_runs(RunQuery(job=key("job_1")))
    assert [r.nominal_ms for r in page.items] == [1_000_000, 10, 9]


def test_the_idempotency_key_is_its_own_item_with_a_ttl(store: DynamoStore) -> None:
    record = IdempotencyRecord(
        tenant_id="t#1", key="k1", fingerprint="f", job_id="job_1", created_ms=T0, expires_ms=T0 + 86_400_500
    )
    store.create_job(make_job("job_1", tenant_id="t#1"), [make_run("job_1")], record)
    item = raw(store, "IDEM#t%231#k1", "IDEM")  # the tenant is escaped: a '#' cannot shift the key
    assert item["job_id"] == {"S": "job_1"}
    assert item["ttl"] == {"N": str((T0 + 86_400_500) // 1000 + 1)}  # seconds, never before expiry


def test_shards_are_a_stable_hash_of_the_id_spread_over_16() -> None:
    assert shard_of(f"job_1:{T0}") == shard_of(f"job_1:{T0}") == 6  # crc32: the same in every process
    assert {shard_of(f"job_1:{T0 + i}") for i in range(200)} == set(range(16))


# -- sparse indexes -----------------------------------------------------------------------------


def test_a_run_moves_between_gsi1_partitions_and_leaves_it_when_it_ends(store: DynamoStore) -> None:
    run_id = f"job_1:{T0}"
    shard = shard_of(run_id)
    store.add_runs([make_run("job_1")])
    assert gsi(store, "GSI1", f"SCHEDULED#DEFAULT#{shard}") == [f"JOB#job_1/{run_sk(T0)}"]

    store.claim([run_id], T0, "scanner", 5000)
    assert gsi(store, "GSI1", f"SCHEDULED#DEFAULT#{shard}") == []
    assert gsi(store, "GSI1", f"CLAIMED#{shard}") == [f"JOB#job_1/{run_sk(T0)}"]

    moves = [
        Transition(run_id, frozenset({S.CLAIMED}), S.RUNNING, 1, {"lease_expires_ms": T0 + 30_000}),
        Transition(run_id, frozenset({S.RUNNING}), S.SUCCEEDED, 1, {"finished_ms": T0}),
    ]
    calls = Calls(store)
    assert all(store.transition(moves))
    assert calls.ops == {"UpdateItem": 2}  # each transition keeps GSI1 in its own write, no repair
    for state in ("CLAIMED", "RUNNING"):
        assert gsi(store, "GSI1", f"{state}#{shard}") == []
    item = raw(store, "JOB#job_1", run_sk(T0))
    assert "GSI1PK" not in item and "GSI1SK" not in item


def test_the_gsi1_sort_key_follows_the_lease_and_the_due_time(store: DynamoStore) -> None:
    run_id = f"job_1:{T0}"
    store.add_runs([make_run("job_1", state=S.RUNNING, fence=1, lease_owner="w", lease_expires_ms=T0 + 10)])
    beat = Transition(run_id, frozenset({S.RUNNING}), S.RUNNING, 1, {"lease_expires_ms": T0 + 30_000})
    store.transition([beat])
    assert raw(store, "JOB#job_1", run_sk(T0))["GSI1SK"] == {"N": str(T0 + 30_000)}
    retry = Transition(run_id, frozenset({S.RUNNING}), S.SCHEDULED, 1, {"due_ms": T0 + 700, "lease_expires_ms": None})
    store.transition([retry])
    item = raw(store, "JOB#job_1", run_sk(T0))
    assert (item["GSI1PK"]["S"], item["GSI1SK"]) == (f"SCHEDULED#DEFAULT#{shard_of(run_id)}", {"N": str(T0 + 700)})


def test_a_leased_state_entered_without_a_lease_is_not_left_indexed_by_its_due_time(store: DynamoStore) -> None:
    """SCHEDULED -> CLAIMED through `transition` without a lease: the expression cannot know the
    lease, so the store repairs GSI1 after it; the reaper must never take the due time for a lease."""
    store.add_runs([make_run("job_1", T0)])
    t = Transition(f"job_1:{T0}", frozenset({S.SCHEDULED}), S.CLAIMED, 0, {"lease_owner": "x"})
    assert store.transition([t])[0] is not None
    item = raw(store, "JOB#job_1", run_sk(T0))
    assert "GSI1PK" not in item and "GSI1SK" not in item
    assert store.expired_leases(T0 + 10**9, 10) == []


def test_dead_letters_are_indexed_until_purged_and_redriven_runs_are_scheduled(store: DynamoStore) -> None:
    run_id = f"job_1:{T0}"
    shard = shard_of(run_id)
    store.add_runs([make_run("job_1", state=S.RUNNING, fence=1, lease_expires_ms=T0)])
    fail = Transition(run_id, frozenset({S.RUNNING}), S.FAILED, 1, {"dead_letter": True, "lease_expires_ms": None})
    store.transition([fail])
    assert gsi(store, "GSI1", f"DEAD#{shard}") == [f"JOB#job_1/{run_sk(T0)}"]
    assert gsi(store, "GSI1", f"RUNNING#{shard}") == []
    redrive = Transition(run_id, frozenset({S.FAILED}), S.SCHEDULED, 1, {"dead_letter": False, "due_ms": T0 + 5})
    store.transition([redrive])
    assert gsi(store, "GSI1", f"DEAD#{shard}") == []
    assert gsi(store, "GSI1", f"SCHEDULED#DEFAULT#{shard}") == [f"JOB#job_1/{run_sk(T0)}"]


def test_a_job_is_due_only_while_active_with_a_next_fire(store: DynamoStore) -> None:
    shard = shard_of("job_1")
    store.create_job(make_job("job_1", next_fire_ms=T0), [make_run("job_1", state=S.RUNNING, fence=1)])
    assert gsi(store, "GSI2", f"DUE#{shard}") == ["JOB#job_1/META"]
    job = store.get_jobs([key("job_1")])[key("job_1")]
    paused = store.update_job(job.model_copy(update={"status": JobStatus.PAUSED}))
    assert gsi(store, "GSI2", f"DUE#{shard}") == []
    store.update_job(paused.model_copy(update={"status": JobStatus.ACTIVE}))
    assert [j.job_id for j in store.due_jobs(T0, 10)] == ["job_1"]
    done = Transition(f"job_1:{T0}", frozenset({S.RUNNING}), S.SUCCEEDED, 1, job_status=JobStatus.COMPLETED)
    store.transition([done])
    assert gsi(store, "GSI2", f"DUE#{shard}") == []
    assert store.get_jobs([key("job_1")])[key("job_1")].status is JobStatus.COMPLETED


# -- fan-out and batching -----------------------------------------------------------------------


def test_the_reaper_queries_16_shards_of_each_leased_state_at_once(store: DynamoStore) -> None:
    leased = [S.CLAIMED, S.DISPATCHED, S.RUNNING]
    runs = [make_run(f"job_{i}", T0, state=leased[i % 3], fence=1, lease_expires_ms=T0 - 1000 + i) for i in range(48)]
    runs.append(make_run("job_live", T0, state=S.RUNNING, fence=1, lease_expires_ms=T0 + 1))
    store.add_runs(runs)
    assert len({shard_of(r.run_id) for r in runs}) == 16
    calls = Calls(store)
    expired = store.expired_leases(T0, 100)
    assert [r.job_id for r in expired] == [f"job_{i}" for i in range(48)]  # oldest lease first
    assert calls.ops == {"Query": 48} and calls.indexes == {"GSI1": 48}
    assert len(calls.threads) > 1  # in parallel, from the store's pool
    assert [r.job_id for r in store.expired_leases(T0, 5)] == [f"job_{i}" for i in range(5)]


def test_overdue_runs_stop_at_the_tier_that_fills_the_limit(store: DynamoStore) -> None:
    store.add_runs([make_run(f"job_c{i}", T0 - i, priority=Priority.CRITICAL) for i in range(3)])
    store.add_runs([make_run("job_low", T0 - 99, priority=Priority.LOW)])
    calls = Calls(store)
    assert [r.job_id for r in store.overdue_runs(T0, 3)] == ["job_c2", "job_c1", "job_c0"]
    assert calls.ops == {"Query": 16}  # CRITICAL's 16 shards only
    assert [r.job_id for r in store.overdue_runs(T0, 10)][-1] == "job_low"


def test_due_jobs_query_16_shards_of_gsi2(store: DynamoStore) -> None:
    for i in range(20):
        store.create_job(make_job(f"job_{i:02d}", next_fire_ms=T0 + i), [])
    calls = Calls(store)
    assert [j.job_id for j in store.due_jobs(T0 + 9, 100)] == [f"job_{i:02d}" for i in range(10)]
    assert calls.ops == {"Query": 16} and calls.indexes == {"GSI2": 16}


def test_reads_by_id_are_batched_100_keys_per_call(store: DynamoStore) -> None:
    store.add_runs([make_run("job_1", T0 + i) for i in range(150)])
    calls = Calls(store)
    found = store.get_runs([f"job_1:{T0 + i}" for i in range(160)] + ["not-a-run-id"])
    assert len(found) == 150
    assert calls.ops == {"BatchGetItem": 2}


def test_claims_are_concurrent_conditional_updates(store: DynamoStore) -> None:
    store.add_runs([make_run("job_1", T0 + i) for i in range(40)])
    calls = Calls(store)
    claimed = store.claim([f"job_1:{T0 + i}" for i in range(40)], T0 + 20, "scanner", 5000)
    assert len(claimed) == 21  # due_ms <= now
    assert calls.ops == {"UpdateItem": 40}
    assert calls.errors == {"UpdateItem:ConditionalCheckFailedException": 19}
    assert len(calls.threads) > 1


def test_transitions_of_one_run_in_a_batch_apply_in_order(store: DynamoStore) -> None:
    store.add_runs([make_run("job_1", state=S.CLAIMED, fence=1)])
    run_id = f"job_1:{T0}"
    out = store.transition(
        [
            Transition(run_id, frozenset({S.CLAIMED}), S.DISPATCHED, 1, {"lease_expires_ms": T0 + 9}),
            Transition(run_id, frozenset({S.DISPATCHED}), S.RUNNING, 1, {"lease_expires_ms": T0 + 30}),
            Transition(run_id, frozenset({S.RUNNING}), S.SUCCEEDED, 1, {"lease_expires_ms": None}),
        ]
    )
    assert [r.state if r else None for r in out] == [S.DISPATCHED, S.RUNNING, S.SUCCEEDED]


# -- conditions and transactions ----------------------------------------------------------------


def test_a_stale_fence_is_rejected_by_dynamodb_itself(store: DynamoStore) -> None:
    store.add_runs([make_run("job_1", state=S.RUNNING, fence=5, lease_owner="w")])
    calls = Calls(store)
    late = Transition(f"job_1:{T0}", frozenset({S.RUNNING}), S.SUCCEEDED, 4, {"result": "late"})
    assert store.transition([late]) == [None]
    assert calls.errors == {"UpdateItem:ConditionalCheckFailedException": 1}
    item = raw(store, "JOB#job_1", run_sk(T0))
    assert (item["state"], item["fence"], "result" in item) == ({"S": "RUNNING"}, {"N": "5"}, False)


def test_a_creation_that_fails_writes_neither_job_runs_nor_key(store: DynamoStore) -> None:
    store.create_job(make_job("job_1"), [])
    key = IdempotencyRecord(
        tenant_id="default", key="k1", fingerprint="f", job_id="job_1", created_ms=T0, expires_ms=T0 + 10**6
    )
    calls = Calls(store)
    with pytest.raises(DuplicateJob):
        store.create_job(make_job("job_1"), [make_run("job_1", T0 + 7)], key)
    assert calls.ops == {"TransactWriteItems": 1}
    assert store.idempotency("default", "k1", T0) is None
    assert store.get_runs([f"job_1:{T0 + 7}"]) == {}


def test_a_key_held_for_another_body_stops_the_whole_transaction(store: DynamoStore) -> None:
    def key(job_id: str, fingerprint: str) -> IdempotencyRecord:
        return IdempotencyRecord(
            tenant_id="default", key="k1", fingerprint=fingerprint, job_id=job_id, created_ms=T0, expires_ms=T0 + 10**6
        )

    store.create_job(make_job("job_1"), [make_run("job_1")], key("job_1", "f1"))
    with pytest.raises(IdempotencyConflict):
        store.create_job(make_job("job_2"), [make_run("job_2")], key("job_2", "f2"))
    assert raw(store, "JOB#job_2", "META") == {}
    assert raw(store, "JOB#job_2", run_sk(T0)) == {}


def test_a_run_that_already_exists_is_kept_and_the_job_still_created(store: DynamoStore) -> None:
    store.add_runs([make_run("job_1", T0, attempt=3)])
    result = store.create_job(make_job("job_1"), [make_run("job_1", T0), make_run("job_1", T0 + 1)])
    assert result.created
    runs = store.get_runs([f"job_1:{T0}", f"job_1:{T0 + 1}"])
    assert (runs[f"job_1:{T0}"].attempt, len(runs)) == (3, 2)


def test_runs_beyond_one_transaction_are_added_after_it(store: DynamoStore) -> None:
    runs = [make_run("job_1", T0 + i) for i in range(120)]
    calls = Calls(store)
    store.create_job(make_job("job_1"), runs)
    assert calls.ops == {"TransactWriteItems": 1, "PutItem": 22}  # 98 runs ride with the job and the key
    assert len(store.get_runs([r.run_id for r in runs])) == 120


# -- listings -----------------------------------------------------------------------------------


def test_a_tenants_jobs_page_in_id_order_across_shards(store: DynamoStore) -> None:
    for i in range(20):
        store.create_job(make_job(f"job_{i:02d}", tenant_id="t1"), [])
    store.create_job(make_job("job_05x", tenant_id="t2"), [])
    seen: list[str] = []
    cursor = None
    while True:
        page = store.list_jobs(JobQuery(tenant_id="t1", cursor=cursor, limit=6))
        seen += [j.job_id for j in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == [f"job_{i:02d}" for i in range(20)]


def test_dead_letters_page_newest_first_across_shards(store: DynamoStore) -> None:
    store.add_runs([make_run(f"job_{i}", T0 + i, state=S.FAILED, dead_letter=True) for i in range(12)])
    store.add_runs([make_run("job_other", T0 + 50, state=S.FAILED, dead_letter=True, tenant_id="t2")])
    seen: list[int] = []
    cursor = None
    while True:
        page = store.list_runs(RunQuery(tenant_id="default", dead_letter=True, cursor=cursor, limit=5))
        seen += [r.nominal_ms for r in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == [T0 + i for i in reversed(range(12))]


# -- errors -------------------------------------------------------------------------------------


def test_an_unreachable_endpoint_is_store_unavailable_quickly() -> None:
    url = (
        f"dynamodb://jobq-nowhere?region={REGION}&endpoint=http://127.0.0.1:{free_port()}"
        f"&aws_access_key_id=x&aws_secret_access_key=y&connect_timeout_s=0.5&max_attempts=1"
    )
    store = DynamoStore.from_url(url)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        store.get_runs([f"job_1:{T0}"])
    assert caught.value.retryable
    assert time.monotonic() - started < 5
    store.close()


def test_a_missing_table_is_an_error_that_names_jobq_init(make_store: Callable[..., DynamoStore]) -> None:
    store = make_store("jobq-never-created", create=False)
    with pytest.raises(StoreError, match="jobq init") as caught:
        store.claim([f"job_1:{T0}"], T0, "s", 1000)
    assert not isinstance(caught.value, StoreUnavailable)


def test_throttling_is_store_unavailable(make_store: Callable[..., DynamoStore]) -> None:
    from botocore.stub import Stubber

    store = make_store(max_attempts="1")
    with Stubber(store.table.client) as stub:
        stub.add_client_error("update_item", "ProvisionedThroughputExceededException", http_status_code=400)
        with pytest.raises(StoreUnavailable):
            store.transition([Transition(f"job_1:{T0}", frozenset({S.RUNNING}), S.SUCCEEDED, 1)])


def test_a_creation_cancelled_by_a_concurrent_transaction_is_tried_again(
    make_store: Callable[..., DynamoStore],
) -> None:
    from botocore.stub import Stubber

    store = make_store(max_attempts="1")
    reasons = [{"Code": "None"}, {"Code": "TransactionConflict", "Message": "another transaction holds it"}]
    with Stubber(store.table.client) as stub:
        stub.add_client_error(
            "transact_write_items", "TransactionCanceledException", modeled_fields={"CancellationReasons": reasons}
        )
        stub.add_response("transact_write_items", {})
        assert store.create_job(make_job("job_1"), [make_run("job_1")]).created


def test_unprocessed_keys_of_a_batch_read_are_asked_for_again(store: DynamoStore) -> None:
    from botocore.stub import Stubber

    store.add_runs([make_run("job_1")])
    item = raw(store, "JOB#job_1", run_sk(T0))
    key = {"PK": item["PK"], "SK": item["SK"]}
    with Stubber(store.table.client) as stub:
        stub.add_response("batch_get_item", {"Responses": {}, "UnprocessedKeys": {store.table.name: {"Keys": [key]}}})
        stub.add_response("batch_get_item", {"Responses": {store.table.name: [item]}, "UnprocessedKeys": {}})
        assert list(store.get_runs([f"job_1:{T0}"])) == [f"job_1:{T0}"]


def test_the_connection_pool_matches_the_thread_fan_out(make_store: Callable[..., DynamoStore]) -> None:
    store = make_store(threads="48", create=False)
    assert store.table.client.meta.config.max_pool_connections == 48


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("dynamodb://ab", "store"),
        ("dynamodb://jobq?regoin=us-east-1", "store.regoin"),
        ("dynamodb://jobq?aws_access_key_id=a&aws_secret_access_key=b", "store.aws_access_key_id"),
        ("dynamodb://jobq?threads=many", "store.threads"),
        ("dynamodb://jobq?threads=0", "store.threads"),
    ],
)
def test_bad_urls_name_the_key(url: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        DynamoConfig.from_url(url)
    assert caught.value.key == key


def test_the_table_name_keeps_its_case() -> None:
    assert DynamoConfig.from_url("dynamodb://JobQ-Prod?region=eu-west-1").table == "JobQ-Prod"


# -- the table ----------------------------------------------------------------------------------


def test_creating_the_table_is_idempotent(make_store: Callable[..., DynamoStore]) -> None:
    store = make_store(create=False)
    assert store.create_table() is True
    assert store.create_table() is False
    described = store.table.client.describe_table(TableName=store.table.name)["Table"]
    assert sorted(i["IndexName"] for i in described["GlobalSecondaryIndexes"]) == ["GSI1", "GSI2", "GSI3"]
    assert described["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    ttl = store.table.client.describe_time_to_live(TableName=store.table.name)["TimeToLiveDescription"]
    assert ttl == {"TimeToLiveStatus": "ENABLED", "AttributeName": "ttl"}


def test_a_table_without_the_indexes_is_refused(make_store: Callable[..., DynamoStore]) -> None:
    store = make_store(create=False)
    bare = {k: v for k, v in table_definition(store.table.name).items() if k != "GlobalSecondaryIndexes"}
    bare["AttributeDefinitions"] = bare["AttributeDefinitions"][:2]
    store.table.client.create_table(**bare)
    with pytest.raises(StoreError, match="GSI1"):
        store.create_table()


def test_the_cloudformation_template_is_the_create_table_request() -> None:
    template = json.loads(render_definition("jobq-prod", "cloudformation"))
    table = template["Resources"]["JobqTable"]
    assert table["Type"] == "AWS::DynamoDB::Table"
    definition = table_definition("jobq-prod")
    assert {k: table["Properties"][k] for k in definition} == definition
    assert table["Properties"]["TimeToLiveSpecification"] == {"AttributeName": "ttl", "Enabled": True}


def test_the_terraform_resource_names_every_index() -> None:
    text = render_definition("jobq-prod", "terraform")
    assert text.startswith('resource "aws_dynamodb_table" "jobq" {\n')
    assert re.search(r'\n  name +\= "jobq-prod"\n', text)
    for index in ("GSI1", "GSI2", "GSI3"):
        assert re.search(rf'global_secondary_index {{\n    name +\= "{index}"\n    hash_key +\= "{index}PK"', text)
    assert re.search(r'non_key_attributes = \["tenant_id", "status", "priority", "name"\]', text)
    assert re.search(r'ttl {\n    attribute_name = "ttl"', text)


@pytest.mark.skipif(not have_binary("terraform"), reason="terraform is not installed")
def test_the_terraform_resource_is_canonical_hcl() -> None:
    text = render_definition("jobq-prod", "terraform")
    check = subprocess.run(["terraform", "fmt", "-check", "-"], input=text, capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr  # 2: not HCL; 3: not as `terraform fmt` lays it out


@pytest.mark.skipif(not have_binary("cfn-lint"), reason="cfn-lint is not installed")
def test_the_cloudformation_template_passes_cfn_lint(tmp_path: Path) -> None:
    template = tmp_path / "jobq.json"
    template.write_text(render_definition("jobq-prod", "cloudformation"))
    check = subprocess.run(["cfn-lint", str(template)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr


def test_an_unknown_definition_format_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        render_definition("jobq-prod", "yaml")  # type: ignore[arg-type]


# -- tables written before job ids were scoped by tenant ---------------------------------------


def _legacy(store: DynamoStore, job_id: str, tenant: str, runs: list[Any]) -> None:
    """What the previous version wrote: the job at JOB#<job_id> and its runs named job_id:ms,
    whatever the tenant (built as `default`'s items, then given the tenant)."""
    from jobq.store.dynamodb_items import as_s, job_item, run_item

    job = make_job(job_id, last_run_id=runs[-1].run_id if runs else None)
    items = [job_item(job), *(run_item(r) for r in runs)]
    for item in items:
        item["tenant_id"] = as_s(tenant)
    items[0]["GSI3PK"] = as_s(f"JOBS#{tenant}#{shard_of(job_id)}")
    items[0]["doc"] = as_s(job.model_copy(update={"tenant_id": tenant}).model_dump_json())
    for item in items:
        store.table.call("put_item", TableName=store.table.name, Item=item)


def test_jobq_init_moves_jobs_of_other_tenants_to_their_tenant_scoped_keys(store: DynamoStore) -> None:
    from jobq.store.dynamodb_upgrade import move_legacy_jobs

    leased = {"state": S.RUNNING, "fence": 3, "lease_owner": "w", "lease_expires_ms": T0 - 5}
    runs = [make_run("report", T0, **leased), make_run("report", T0 + 1000, prev_run_id=f"report:{T0}")]
    _legacy(store, "report", "acme", runs)
    _legacy(store, "nightly", "default", [make_run("nightly", T0)])
    assert store.get_jobs([key("report", "acme")]) == {}  # not where this version looks
    assert move_legacy_jobs(store) == 1
    job = store.get_jobs([key("report", "acme")])[key("report", "acme")]
    assert (job.tenant_id, job.last_run_id) == ("acme", f"acme/report:{T0 + 1000}")
    moved = store.list_runs(RunQuery(job=key("report", "acme"))).items
    assert [(r.run_id, r.prev_run_id) for r in moved] == [
        (f"acme/report:{T0 + 1000}", f"acme/report:{T0}"),
        (f"acme/report:{T0}", None),
    ]
    assert [r.run_id for r in store.expired_leases(T0, 10)] == [f"acme/report:{T0}"]  # GSI1, new shard
    assert [r.run_id for r in store.overdue_runs(T0 + 1000, 10)] == [f"nightly:{T0}", f"acme/report:{T0 + 1000}"]
    assert raw(store, "JOB#report", "META") == {} and raw(store, "JOB#report", run_sk(T0)) == {}
    assert set(store.get_jobs([key("nightly")])) == {key("nightly")}  # `default` keeps its keys
    assert move_legacy_jobs(store) == 0
