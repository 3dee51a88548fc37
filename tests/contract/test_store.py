"""The JobStore contract: every backend must pass every test here against its real server."""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from factories import T0, key, make_job, make_run
from sqlite_template import fresh_sqlite

from jobq.errors import Conflict, DuplicateJob, IdempotencyConflict, JobNotFound
from jobq.models import IdempotencyRecord, Job, JobStatus, Priority, RetryPolicy, RunState, TaskInfo, Transition
from jobq.ports import JobQuery, JobStore, RunQuery
from jobq.sharding import JOB_SHARDS
from jobq.sqlitedb import SqliteDatabase
from jobq.store.memory import MemoryStore
from jobq.store.sqlite import SqliteStore

from .poison import write_poison_job, write_poison_run


def _memory(tmp_path: Path) -> JobStore:
    return MemoryStore()


def _sqlite(tmp_path: Path) -> JobStore:
    return SqliteStore(SqliteDatabase(fresh_sqlite(tmp_path / "store.db")))


def _postgres(tmp_path: Path) -> JobStore:
    """A store in a schema of its own, dropped when the store is closed (skipped without a server)."""
    from services import require_postgres

    dsn = require_postgres()
    import psycopg

    from jobq.store.postgres import PostgresStore

    class ScratchStore(PostgresStore):
        def close(self) -> None:
            super().close()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{self.db.schema}" CASCADE')

    return ScratchStore.from_url(f"{dsn}?schema=jobq_contract_{uuid.uuid4().hex[:12]}&pool_max=8")


# moto's server checks a write's condition and applies it without a lock, and a cancelled
# transaction restores a snapshot of the whole table taken when it began: concurrent conditional
# writes to one item can both win (5 of 100 eight-way races here, with plain boto3). DynamoDB
# serialises the writes to an item; this lock does it for every DynamoDB store of the process, so
# the suite tests jobq's conditions rather than moto's locking. Reads stay concurrent.
_MOTO_WRITE_LOCK = threading.Lock()
_WRITES = frozenset({"put_item", "update_item", "delete_item", "transact_write_items", "batch_write_item"})


def _dynamodb(tmp_path: Path) -> JobStore:
    """A table of its own on moto's server, deleted when the store is closed (skipped without moto)."""
    from moto_server import ACCESS_KEY, REGION, SECRET_KEY, shared_moto_server

    from jobq.store.dynamodb import DynamoStore

    server = shared_moto_server()
    url = (
        f"dynamodb://jobq-contract-{uuid.uuid4().hex[:12]}?region={REGION}&endpoint={server.endpoint_url}"
        f"&aws_access_key_id={ACCESS_KEY}&aws_secret_access_key={SECRET_KEY}"
    )

    class ScratchStore(DynamoStore):
        def close(self) -> None:
            self.delete_table()
            super().close()

    store = ScratchStore.from_url(url)
    call = store.table.call

    def serialised(operation: str, **kwargs: object) -> dict[str, object]:
        if operation not in _WRITES:
            return call(operation, **kwargs)
        with _MOTO_WRITE_LOCK:
            return call(operation, **kwargs)

    store.table.call = serialised  # type: ignore[method-assign]
    store.create_table()
    return store


# Backends register here; the production backends add theirs (with a skip when the server is absent).
STORES: dict[str, Callable[[Path], JobStore]] = {
    "memory": _memory,
    "sqlite": _sqlite,
    "postgres": _postgres,
    "dynamodb": _dynamodb,
}


@pytest.fixture(params=sorted(STORES))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobStore]:
    backend = STORES[request.param](tmp_path)
    yield backend
    backend.close()


S = RunState


def _move(store: JobStore, run_id: str, expect: set[RunState], to: RunState, fence: int | None, **changes: object):
    return store.transition([Transition(run_id, frozenset(expect), to, fence, changes, at_ms=T0 + 1)])[0]


def idem(key: str = "k1", fingerprint: str = "f1", job_id: str = "job_1", expires_ms: int = T0 + 86_400_000):
    return IdempotencyRecord(
        tenant_id="default",
        key=key,
        fingerprint=fingerprint,
        job_id=job_id,
        created_ms=T0,
        expires_ms=expires_ms,
        response=f'{{"job_id": "{job_id}"}}',
    )


class TestJobs:
    def test_a_created_job_can_be_read_back(self, store: JobStore) -> None:
        store.create_job(make_job("job_1", payload={"args": [1], "kwargs": {"a": "b"}}), [])
        job = store.get_jobs([key("job_1")])[key("job_1")]
        assert job.payload == {"args": [1], "kwargs": {"a": "b"}}
        assert job.schedule.at_ms == T0

    def test_the_first_runs_are_written_with_the_job(self, store: JobStore) -> None:
        store.create_job(make_job("job_1"), [make_run("job_1")])
        assert list(store.get_runs([f"job_1:{T0}"])) == [f"job_1:{T0}"]

    def test_a_duplicate_job_id_is_refused_and_writes_nothing(self, store: JobStore) -> None:
        store.create_job(make_job("job_1", name="first"), [])
        with pytest.raises(DuplicateJob):
            store.create_job(make_job("job_1", name="second"), [make_run("job_1", T0 + 5)])
        assert store.get_jobs([key("job_1")])[key("job_1")].name == "first"
        assert store.get_runs([f"job_1:{T0 + 5}"]) == {}

    def test_the_same_idempotency_key_and_body_returns_the_original_job(self, store: JobStore) -> None:
        first = store.create_job(make_job("job_1"), [make_run("job_1")], idem(job_id="job_1"))
        again = store.create_job(make_job("job_2"), [make_run("job_2")], idem(job_id="job_2"))
        assert first.created and not again.created
        assert again.job.job_id == "job_1"
        assert again.response == '{"job_id": "job_1"}'
        assert store.get_jobs([key("job_2")]) == {}
        assert store.get_runs([f"job_2:{T0}"]) == {}

    def test_the_same_idempotency_key_with_another_body_is_a_conflict(self, store: JobStore) -> None:
        store.create_job(make_job("job_1"), [], idem(fingerprint="f1"))
        with pytest.raises(IdempotencyConflict):
            store.create_job(make_job("job_2"), [], idem(fingerprint="f2", job_id="job_2"))
        assert store.get_jobs([key("job_2")]) == {}

    def test_an_expired_idempotency_key_may_be_used_again(self, store: JobStore) -> None:
        store.create_job(make_job("job_1"), [], idem(expires_ms=T0 - 1))
        assert store.create_job(make_job("job_2"), [], idem(job_id="job_2")).created
        record = store.idempotency("default", "k1", T0)
        assert record is not None and record.job_id == "job_2"

    def test_idempotency_keys_are_per_tenant(self, store: JobStore) -> None:
        store.create_job(make_job("job_1"), [], idem())
        other = idem(job_id="job_2").model_copy(update={"tenant_id": "other"})
        assert store.create_job(make_job("job_2", tenant_id="other"), [], other).created

    def test_update_is_a_compare_and_set_on_version(self, store: JobStore) -> None:
        store.create_job(make_job("job_1"), [])
        job = store.get_jobs([key("job_1")])[key("job_1")]
        updated = store.update_job(job.model_copy(update={"status": JobStatus.PAUSED}))
        assert updated.version == job.version + 1
        with pytest.raises(Conflict):
            store.update_job(job.model_copy(update={"status": JobStatus.CANCELLED}))
        assert store.get_jobs([key("job_1")])[key("job_1")].status is JobStatus.PAUSED

    def test_updating_a_missing_job_raises_not_found(self, store: JobStore) -> None:
        with pytest.raises(JobNotFound):
            store.update_job(make_job("job_missing"))

    def test_due_jobs_are_active_jobs_with_a_fire_time_before_the_bound(self, store: JobStore) -> None:
        store.create_job(make_job("job_a", next_fire_ms=T0 + 10), [])
        store.create_job(make_job("job_b", next_fire_ms=T0 + 5), [])
        store.create_job(make_job("job_c", next_fire_ms=T0 + 50), [])
        store.create_job(make_job("job_d", next_fire_ms=T0, status=JobStatus.PAUSED), [])
        store.create_job(make_job("job_e", next_fire_ms=None), [])
        assert [j.job_id for j in store.due_jobs(T0 + 10, 100)] == ["job_b", "job_a"]
        assert [j.job_id for j in store.due_jobs(T0 + 10, 1)] == ["job_b"]

    def test_list_jobs_filters_by_tenant_status_priority_and_name_prefix(self, store: JobStore) -> None:
        store.create_job(make_job("job_1", name="billing.run", priority=Priority.HIGH), [])
        store.create_job(make_job("job_2", name="billing.audit", status=JobStatus.PAUSED), [])
        store.create_job(make_job("job_3", name="mail.send", tenant_id="t2"), [])
        ids = lambda q: [j.job_id for j in store.list_jobs(q).items]  # noqa: E731
        assert ids(JobQuery(name_prefix="billing.")) == ["job_1", "job_2"]
        assert ids(JobQuery(status=JobStatus.PAUSED)) == ["job_2"]
        assert ids(JobQuery(priority=Priority.HIGH)) == ["job_1"]
        assert ids(JobQuery(tenant_id="t2")) == ["job_3"]
        assert ids(JobQuery(name_prefix="bill%")) == []

    def test_list_jobs_filters_by_job_id_prefix_in_a_tenant_and_across_tenants(self, store: JobStore) -> None:
        for job_id in ("app.a", "app.b", "app.c", "apps.x", "ap", "zz.app.q"):
            store.create_job(make_job(job_id), [])
        store.create_job(make_job("app.t2", tenant_id="t2"), [])
        ids = lambda q: [j.job_id for j in store.list_jobs(q).items]  # noqa: E731
        assert ids(JobQuery(tenant_id="default", id_prefix="app.")) == ["app.a", "app.b", "app.c"]
        assert ids(JobQuery(id_prefix="app.")) == ["app.a", "app.b", "app.c", "app.t2"]
        assert ids(JobQuery(id_prefix="app%")) == []
        first = store.list_jobs(JobQuery(tenant_id="default", id_prefix="app.", limit=2))
        assert [j.job_id for j in first.items] == ["app.a", "app.b"] and first.next_cursor is not None
        rest = JobQuery(tenant_id="default", id_prefix="app.", cursor=first.next_cursor, limit=2)
        assert ids(rest) == ["app.c"]

    def test_list_jobs_pages_cover_every_job_once(self, store: JobStore) -> None:
        for i in range(7):
            store.create_job(make_job(f"job_{i}"), [])
        seen, cursor = [], None
        while True:
            page = store.list_jobs(JobQuery(cursor=cursor, limit=3))
            seen += [j.job_id for j in page.items]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert seen == [f"job_{i}" for i in range(7)]

    @pytest.mark.parametrize("tenant", [None, "t2"])
    def test_newest_first_lists_jobs_by_descending_id_across_pages(self, store: JobStore, tenant: str | None) -> None:
        for i in range(7):
            store.create_job(make_job(f"job_{i}", tenant_id=tenant or ("t1" if i % 2 else "t2")), [])
        store.create_job(make_job("job_3", tenant_id="t2" if tenant is None else "t3"), [])  # an id two tenants hold
        seen, cursor = [], None
        while True:
            page = store.list_jobs(JobQuery(tenant_id=tenant, cursor=cursor, limit=3, newest_first=True))
            seen += [(j.job_id, j.tenant_id) for j in page.items]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        expected = sorted(
            [(f"job_{i}", tenant or ("t1" if i % 2 else "t2")) for i in range(7)]
            + ([("job_3", "t2")] if tenant is None else []),
            reverse=True,
        )
        assert seen == expected

    @pytest.mark.parametrize("tenant", [None, "t1"])
    def test_newest_first_pages_through_an_id_prefix(self, store: JobStore, tenant: str | None) -> None:
        for job_id in ("aaa", "app.a", "app.b", "app.c", "app.d", "app.e", "apq", "zzz"):
            store.create_job(make_job(job_id, tenant_id="t1"), [])
        seen, cursor = [], None
        while True:
            query = JobQuery(tenant_id=tenant, id_prefix="app.", cursor=cursor, limit=2, newest_first=True)
            page = store.list_jobs(query)
            seen += [j.job_id for j in page.items]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert seen == ["app.e", "app.d", "app.c", "app.b", "app.a"]


class TestRuns:
    def test_adding_runs_is_idempotent_and_returns_only_new_ones(self, store: JobStore) -> None:
        assert len(store.add_runs([make_run("job_1", T0), make_run("job_1", T0 + 1000)])) == 2
        added = store.add_runs([make_run("job_1", T0, attempt=9), make_run("job_1", T0 + 2000)])
        assert [r.run_id for r in added] == [f"job_1:{T0 + 2000}"]
        assert store.get_runs([f"job_1:{T0}"])[f"job_1:{T0}"].attempt == 1

    def test_claim_takes_due_scheduled_runs_and_bumps_the_fence(self, store: JobStore) -> None:
        store.add_runs([make_run("job_1", T0), make_run("job_2", T0 + 10_000)])
        claimed = store.claim([f"job_1:{T0}", f"job_2:{T0 + 10_000}", "job_9:1"], T0, "scanner-1", 5000)
        assert [r.run_id for r in claimed] == [f"job_1:{T0}"]
        run = claimed[0]
        assert (run.state, run.fence, run.lease_owner, run.lease_expires_ms) == (S.CLAIMED, 1, "scanner-1", T0 + 5000)
        assert run.version == 1

    def test_claim_looks_ahead_to_due_by_with_its_lease_from_now(self, store: JobStore) -> None:
        store.add_runs([make_run("job_1", T0 + 200), make_run("job_2", T0 + 400)])
        ids = [f"job_1:{T0 + 200}", f"job_2:{T0 + 400}"]
        assert store.claim(ids, T0, "scanner-1", 5000) == [], "not due yet"
        claimed = store.claim(ids, T0, "scanner-1", 5000, due_by_ms=T0 + 300)
        assert [(r.run_id, r.lease_expires_ms) for r in claimed] == [(f"job_1:{T0 + 200}", T0 + 5000)]

    def test_a_run_is_claimed_once(self, store: JobStore) -> None:
        store.add_runs([make_run("job_1")])
        assert len(store.claim([f"job_1:{T0}"], T0, "a", 5000)) == 1
        assert store.claim([f"job_1:{T0}"], T0, "b", 5000) == []

    def test_concurrent_claimers_take_each_run_exactly_once(self, store: JobStore) -> None:
        ids = [f"job_1:{T0 + i}" for i in range(200)]
        store.add_runs([make_run("job_1", T0 + i) for i in range(200)])
        got: list[list[str]] = [[] for _ in range(4)]

        def claimer(n: int) -> None:
            for start in range(0, 200, 20):
                got[n] += [r.run_id for r in store.claim(ids[start : start + 20], T0 + 1000, f"s{n}", 5000)]

        threads = [threading.Thread(target=claimer, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        everything = [r for g in got for r in g]
        assert sorted(everything) == sorted(ids)

    def test_a_transition_applies_when_state_and_fence_match(self, store: JobStore) -> None:
        store.add_runs([make_run("job_1", fence=4, state=S.DISPATCHED)])
        run = _move(
            store,
            f"job_1:{T0}",
            {S.CLAIMED, S.DISPATCHED},
            S.RUNNING,
            4,
            lease_owner="w1",
            lease_expires_ms=T0 + 30_000,
            started_ms=T0,
        )
        assert run is not None
        assert (run.state, run.fence, run.lease_owner, run.started_ms, run.version) == (S.RUNNING, 4, "w1", T0, 1)
        assert run.updated_ms == T0 + 1

    def test_a_transition_is_rejected_when_the_fence_moved(self, store: JobStore) -> None:
        store.add_runs([make_run("job_1", fence=5, state=S.RUNNING)])
        assert _move(store, f"job_1:{T0}", {S.RUNNING}, S.SUCCEEDED, 4) is None
        assert store.get_runs([f"job_1:{T0}"])[f"job_1:{T0}"].state is S.RUNNING

    def test_a_transition_is_rejected_when_the_state_moved(self, store: JobStore) -> None:
        store.add_runs([make_run("job_1", fence=5, state=S.CANCELLED)])
        assert _move(store, f"job_1:{T0}", {S.RUNNING}, S.SUCCEEDED, 5) is None

    def test_a_transition_can_require_the_lease_owner(self, store: JobStore) -> None:
        store.add_runs([make_run("job_1", fence=1, state=S.RUNNING, lease_owner="w1")])
        t = Transition(f"job_1:{T0}", frozenset({S.RUNNING}), S.RUNNING, 1, {"lease_expires_ms": 9}, expect_owner="w2")
        assert store.transition([t]) == [None]

    def test_a_transition_of_a_missing_run_is_rejected(self, store: JobStore) -> None:
        assert _move(store, "job_x:1", {S.RUNNING}, S.SUCCEEDED, 1) is None

    def test_bump_fence_and_changes_apply_in_the_same_write(self, store: JobStore) -> None:
        store.add_runs([make_run("job_1", fence=2, state=S.RUNNING)])
        t = Transition(
            f"job_1:{T0}",
            frozenset({S.RUNNING}),
            S.FAILED,
            2,
            {"dead_letter": True, "last_error": "boom", "result": {"status": 500, "body": "x"}},
            bump_fence=True,
            at_ms=T0 + 7,
        )
        [run] = store.transition([t])
        assert run is not None
        assert (run.fence, run.dead_letter, run.last_error) == (3, True, "boom")
        stored = store.get_runs([f"job_1:{T0}"])[f"job_1:{T0}"]
        assert stored.result == {"status": 500, "body": "x"} and stored.dead_letter

    def test_a_batch_reports_each_transition_on_its_own(self, store: JobStore) -> None:
        store.add_runs([make_run("job_1", fence=1, state=S.CLAIMED), make_run("job_2", fence=1, state=S.CLAIMED)])
        out = store.transition(
            [
                Transition(f"job_1:{T0}", frozenset({S.CLAIMED}), S.DISPATCHED, 1),
                Transition(f"job_2:{T0}", frozenset({S.CLAIMED}), S.DISPATCHED, 7),
            ]
        )
        assert out[0] is not None and out[0].state is S.DISPATCHED
        assert out[1] is None

    def test_expired_leases_lists_leased_runs_whose_lease_ran_out(self, store: JobStore) -> None:
        store.add_runs(
            [
                make_run("job_1", state=S.RUNNING, lease_expires_ms=T0 - 10),
                make_run("job_2", state=S.DISPATCHED, lease_expires_ms=T0 - 20),
                make_run("job_3", state=S.CLAIMED, lease_expires_ms=T0 + 10),
                make_run("job_4", state=S.SUCCEEDED, lease_expires_ms=T0 - 10),
            ]
        )
        assert [r.job_id for r in store.expired_leases(T0, 10)] == ["job_2", "job_1"]

    def test_overdue_runs_come_critical_first_then_by_due_time(self, store: JobStore) -> None:
        store.add_runs(
            [
                make_run("job_low", T0 - 50, priority=Priority.LOW),
                make_run("job_def", T0 - 10, priority=Priority.DEFAULT),
                make_run("job_crit", T0, priority=Priority.CRITICAL),
                make_run("job_def2", T0 - 20, priority=Priority.DEFAULT),
                make_run("job_future", T0 + 1, priority=Priority.CRITICAL),
            ]
        )
        assert [r.job_id for r in store.overdue_runs(T0, 10)] == ["job_crit", "job_def2", "job_def", "job_low"]
        assert [r.job_id for r in store.overdue_runs(T0, 2)] == ["job_crit", "job_def2"]

    def test_list_runs_filters_and_pages_newest_first(self, store: JobStore) -> None:
        store.add_runs(
            [
                make_run("job_1", T0 + i, state=S.FAILED if i % 2 else S.SUCCEEDED, dead_letter=bool(i % 2))
                for i in range(5)
            ]
        )
        store.add_runs([make_run("job_2", T0)])
        page = store.list_runs(RunQuery(job=key("job_1"), limit=2))
        assert [r.nominal_ms for r in page.items] == [T0 + 4, T0 + 3]
        rest = store.list_runs(RunQuery(job=key("job_1"), cursor=page.next_cursor, limit=10))
        assert [r.nominal_ms for r in rest.items] == [T0 + 2, T0 + 1, T0]
        assert rest.next_cursor is None
        dead = store.list_runs(RunQuery(dead_letter=True))
        assert [r.nominal_ms for r in dead.items] == [T0 + 3, T0 + 1]
        assert len(store.list_runs(RunQuery(states=frozenset({S.SCHEDULED}))).items) == 1


class TestWorkers:
    def test_known_tasks_are_the_union_of_registered_workers(self, store: JobStore) -> None:
        assert store.known_tasks() == set()
        store.register_worker("w1", ["a.one", "a.two"], ["default"], T0)
        store.register_worker("w2", ["b.three"], ["low"], T0)
        store.register_worker("w1", ["a.one", "a.two"], ["default"], T0 + 1)
        assert store.known_tasks() == {"a.one", "a.two", "b.three"}


class TestTaskCatalogue:
    def test_the_newest_publication_of_a_task_wins_and_reads_back_whole(self, store: JobStore) -> None:
        assert store.task_catalogue() == {}
        first = TaskInfo(name="billing.invoice", priority=Priority.LOW, queue="low", worker_id="w1", published_ms=T0)
        store.publish_tasks([first, TaskInfo(name="a.other", worker_id="w1", published_ms=T0)])
        declared = TaskInfo(
            name="billing.invoice",
            priority=Priority.HIGH,
            retry=RetryPolicy(max_retries=1, initial_interval_sec=5),
            timeout_s=60.0,
            queue="high",
            parameters=("customer_id: int", "dry_run: bool = False"),
            worker_id="w2",
            published_ms=T0 + 1,
        )
        store.publish_tasks([declared])
        store.publish_tasks([declared])  # idempotent
        assert store.task_catalogue() == {"billing.invoice": declared, "a.other": store.task_catalogue()["a.other"]}
        assert store.task_catalogue(["billing.invoice", "not.published"]) == {"billing.invoice": declared}
        assert store.task_catalogue([]) == {}


def test_a_sqlite_run_whose_job_key_is_not_text_moves_in_a_batch_that_finishes_jobs(tmp_path: Path) -> None:
    """A hand-made row with a blob for its job id (which no JSON array can carry) is finished
    beside healthy runs, and read back as a corrupt marker; the healthy runs' jobs complete."""
    store = SqliteStore(SqliteDatabase(tmp_path / "store.db"))
    for n in (1, 2):
        store.create_job(make_job(f"job_{n}"), [make_run(f"job_{n}", state=S.RUNNING, fence=1)])
    odd = make_run("odd", state=S.RUNNING, fence=1)
    with store.db.write() as conn:
        conn.execute(
            "INSERT INTO jobq_runs (run_id, job_id, tenant_id, nominal_ms, due_ms, priority, state, attempt, "
            "fence, version, created_ms, updated_ms) VALUES (?, X'00ff', 'default', ?, ?, 2, 'RUNNING', 0, 1, 0, ?, ?)",
            (odd.run_id, T0, T0, T0, T0),
        )
    out = store.transition(
        [
            Transition(run_id, frozenset({S.RUNNING}), S.SUCCEEDED, 1, at_ms=T0 + 5, job_status=JobStatus.COMPLETED)
            for run_id in (f"job_1:{T0}", odd.run_id, f"job_2:{T0}")
        ]
    )
    assert [None if r is None else (r.state, r.corrupt is None) for r in out] == [
        (S.SUCCEEDED, True),
        (S.SUCCEEDED, False),
        (S.SUCCEEDED, True),
    ]
    jobs = store.get_jobs([key("job_1"), key("job_2")])
    assert [jobs[key(f"job_{n}")].status for n in (1, 2)] == [JobStatus.COMPLETED, JobStatus.COMPLETED]
    store.close()


def test_sqlite_store_persists_across_reopening(tmp_path: Path) -> None:
    first = SqliteStore(SqliteDatabase(tmp_path / "s.db"))
    first.create_job(make_job("job_1"), [make_run("job_1")])
    first.close()
    second = SqliteStore(SqliteDatabase(tmp_path / "s.db"))
    assert set(second.get_jobs([key("job_1")])) == {key("job_1")}
    assert set(second.get_runs([f"job_1:{T0}"])) == {f"job_1:{T0}"}
    second.close()


class TestTransitionsTouchingJobsAndVersions:
    def test_a_final_outcome_can_complete_its_job_in_the_same_write(self, store: JobStore) -> None:
        store.create_job(make_job("job_1"), [make_run("job_1", state=S.RUNNING, fence=1)])
        t = Transition(
            f"job_1:{T0}", frozenset({S.RUNNING}), S.SUCCEEDED, 1, at_ms=T0 + 9, job_status=JobStatus.COMPLETED
        )
        assert store.transition([t])[0] is not None
        job = store.get_jobs([key("job_1")])[key("job_1")]
        assert (job.status, job.version, job.updated_ms) == (JobStatus.COMPLETED, 1, T0 + 9)

    def test_a_job_status_is_not_applied_when_the_run_transition_fails(self, store: JobStore) -> None:
        store.create_job(make_job("job_1"), [make_run("job_1", state=S.RUNNING, fence=1)])
        t = Transition(f"job_1:{T0}", frozenset({S.RUNNING}), S.SUCCEEDED, 2, job_status=JobStatus.COMPLETED)
        assert store.transition([t]) == [None]
        assert store.get_jobs([key("job_1")])[key("job_1")].status is JobStatus.ACTIVE

    def test_a_paused_or_cancelled_job_keeps_its_status(self, store: JobStore) -> None:
        store.create_job(make_job("job_1", status=JobStatus.CANCELLED), [make_run("job_1", state=S.RUNNING)])
        t = Transition(f"job_1:{T0}", frozenset({S.RUNNING}), S.SUCCEEDED, 0, job_status=JobStatus.COMPLETED)
        assert store.transition([t])[0] is not None
        assert store.get_jobs([key("job_1")])[key("job_1")].status is JobStatus.CANCELLED

    def test_expect_version_guards_against_a_write_in_between(self, store: JobStore) -> None:
        store.add_runs([make_run("job_1", state=S.RUNNING, fence=1, lease_owner="w", lease_expires_ms=T0)])
        [seen] = store.expired_leases(T0 + 1, 10)
        renew = Transition(seen.run_id, frozenset({S.RUNNING}), S.RUNNING, 1, {"lease_expires_ms": T0 + 30_000})
        assert store.transition([renew])[0] is not None  # a heartbeat lands after the reaper read
        reclaim = Transition(
            seen.run_id, frozenset({S.RUNNING}), S.SCHEDULED, 1, bump_fence=True, expect_version=seen.version
        )
        assert store.transition([reclaim]) == [None]
        assert store.get_runs([seen.run_id])[seen.run_id].state is S.RUNNING


class TestIdempotencyUnderConcurrency:
    def test_concurrent_creations_with_one_key_create_one_job(self, store: JobStore) -> None:
        results: list[object] = []

        def create(n: int) -> None:
            try:
                results.append(store.create_job(make_job(f"job_{n}"), [make_run(f"job_{n}")], idem(job_id=f"job_{n}")))
            except Exception as exc:  # recorded and asserted below
                results.append(exc)

        threads = [threading.Thread(target=create, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        created = [r for r in results if getattr(r, "created", False)]
        assert len(created) == 1
        winner = created[0].job.job_id  # type: ignore[attr-defined]
        assert all(getattr(r, "job", None) is not None and r.job.job_id == winner for r in results)  # type: ignore[attr-defined]
        assert len(store.list_jobs(JobQuery()).items) == 1


def test_overdue_runs_with_the_same_due_time_come_in_run_id_order(store: JobStore) -> None:
    store.add_runs([make_run(f"job_{c}", T0) for c in "dbca"])
    assert [r.job_id for r in store.overdue_runs(T0, 10)] == ["job_a", "job_b", "job_c", "job_d"]


def test_a_batch_naming_one_run_twice_applies_both_in_order(store: JobStore) -> None:
    store.add_runs([make_run("job_1", state=S.CLAIMED, fence=1), make_run("job_2", state=S.CLAIMED, fence=1)])
    out = store.transition(
        [
            Transition(f"job_1:{T0}", frozenset({S.CLAIMED}), S.DISPATCHED, 1, {"dispatched_ms": T0}),
            Transition(f"job_2:{T0}", frozenset({S.CLAIMED}), S.DISPATCHED, 1, {"dispatched_ms": T0}),
            Transition(f"job_1:{T0}", frozenset({S.DISPATCHED}), S.RUNNING, 1, {"lease_owner": "w"}),
        ]
    )
    assert [r.state if r else None for r in out] == [S.DISPATCHED, S.DISPATCHED, S.RUNNING]
    assert store.get_runs([f"job_1:{T0}"])[f"job_1:{T0}"].version == 2


class TestTransitionBatches:
    """A batch of transitions behaves as if each were applied on its own, in order, in one write."""

    def test_each_transition_in_a_batch_of_one_shape_is_held_to_its_own_conditions(self, store: JobStore) -> None:
        store.add_runs([make_run(f"job_{n}", state=S.RUNNING, fence=n, lease_owner=f"w{n}") for n in range(1, 6)])
        store.add_runs([make_run("job_6", state=S.SUCCEEDED, fence=6, lease_owner="w6")])

        def done(n: int, fence: int, owner: str, finished_ms: int) -> Transition:
            changes = {"finished_ms": finished_ms, "last_error": f"e{n}", "result": {"n": n, "s": '"x"'}}
            return Transition(f"job_{n}:{T0}", frozenset({S.RUNNING}), S.SUCCEEDED, fence, changes, expect_owner=owner)

        out = store.transition(
            [
                done(1, 1, "w1", T0 + 1),  # applies
                done(2, 9, "w2", T0 + 2),  # another fence
                done(3, 3, "w3", T0 + 3),  # applies
                done(4, 4, "w9", T0 + 4),  # another owner
                done(7, 7, "w7", T0 + 7),  # no such run
                done(6, 6, "w6", T0 + 6),  # not RUNNING any more
                done(5, 5, "w5", T0 + 5),  # applies
            ]
        )
        assert [None if r is None else (r.run_id, r.finished_ms, r.last_error) for r in out] == [
            (f"job_1:{T0}", T0 + 1, "e1"),
            None,
            (f"job_3:{T0}", T0 + 3, "e3"),
            None,
            None,
            None,
            (f"job_5:{T0}", T0 + 5, "e5"),
        ]
        stored = store.get_runs([f"job_{n}:{T0}" for n in range(1, 7)])
        assert [(stored[f"job_{n}:{T0}"].state, stored[f"job_{n}:{T0}"].version) for n in range(1, 7)] == [
            (S.SUCCEEDED, 1),
            (S.RUNNING, 0),
            (S.SUCCEEDED, 1),
            (S.RUNNING, 0),
            (S.SUCCEEDED, 1),
            (S.SUCCEEDED, 0),
        ]
        assert stored[f"job_2:{T0}"].finished_ms is None and stored[f"job_4:{T0}"].last_error is None
        assert [stored[f"job_{n}:{T0}"].result for n in (1, 3, 5)] == [{"n": n, "s": '"x"'} for n in (1, 3, 5)]

    def test_a_batch_mixing_shapes_applies_each_and_reports_in_the_order_given(self, store: JobStore) -> None:
        store.add_runs([make_run(f"job_{n}", state=S.CLAIMED, fence=1) for n in range(1, 5)])
        out = store.transition(
            [
                Transition(f"job_1:{T0}", frozenset({S.CLAIMED}), S.DISPATCHED, 1, {"dispatched_ms": T0}),
                Transition(f"job_2:{T0}", frozenset({S.CLAIMED}), S.SCHEDULED, 1, bump_fence=True, at_ms=T0 + 2),
                Transition(f"job_3:{T0}", frozenset({S.CLAIMED}), S.DISPATCHED, 2, {"dispatched_ms": T0}),
                Transition(f"job_4:{T0}", frozenset({S.CLAIMED}), S.SCHEDULED, None, bump_fence=True, at_ms=T0 + 4),
            ]
        )
        assert [None if r is None else (r.state, r.fence, r.updated_ms) for r in out] == [
            (S.DISPATCHED, 1, T0),
            (S.SCHEDULED, 2, T0 + 2),
            None,
            (S.SCHEDULED, 2, T0 + 4),
        ]

    def test_a_run_named_twice_is_refused_the_second_time_when_the_first_moved_it_on(self, store: JobStore) -> None:
        store.add_runs([make_run("job_1", state=S.RUNNING, fence=1, lease_owner="w")])
        done = Transition(f"job_1:{T0}", frozenset({S.RUNNING}), S.SUCCEEDED, 1, {"finished_ms": T0 + 1})
        again = Transition(f"job_1:{T0}", frozenset({S.RUNNING}), S.SUCCEEDED, 1, {"finished_ms": T0 + 2})
        out = store.transition([done, again])
        assert out[0] is not None and out[0].finished_ms == T0 + 1 and out[1] is None
        stored = store.get_runs([f"job_1:{T0}"])[f"job_1:{T0}"]
        assert (stored.finished_ms, stored.version) == (T0 + 1, 1)

    def test_a_run_named_twice_sees_the_first_transition_s_fence(self, store: JobStore) -> None:
        store.add_runs([make_run("job_1", state=S.RUNNING, fence=1)])
        retry = Transition(f"job_1:{T0}", frozenset({S.RUNNING}), S.SCHEDULED, 1, bump_fence=True)
        stale = Transition(f"job_1:{T0}", frozenset({S.SCHEDULED}), S.CLAIMED, 1)
        fresh = Transition(f"job_1:{T0}", frozenset({S.SCHEDULED}), S.CLAIMED, 2, {"lease_owner": "s"})
        out = store.transition([retry, stale, fresh])
        assert [None if r is None else (r.state, r.fence, r.version) for r in out] == [
            (S.SCHEDULED, 2, 1),
            None,
            (S.CLAIMED, 2, 2),
        ]

    def test_final_outcomes_of_several_one_offs_complete_each_job_and_only_theirs(self, store: JobStore) -> None:
        for n in range(1, 5):
            store.create_job(make_job(f"job_{n}"), [make_run(f"job_{n}", state=S.RUNNING, fence=1)])

        def done(n: int, fence: int) -> Transition:
            return Transition(
                f"job_{n}:{T0}",
                frozenset({S.RUNNING}),
                S.SUCCEEDED,
                fence,
                at_ms=T0 + n,
                job_status=JobStatus.COMPLETED,
            )

        out = store.transition([done(1, 1), done(2, 5), done(3, 1), done(4, 1)])
        assert [r is not None for r in out] == [True, False, True, True]
        jobs = store.get_jobs([key(f"job_{n}") for n in range(1, 5)])
        assert [(j.status, j.version, j.updated_ms) for j in (jobs[key(f"job_{n}")] for n in range(1, 5))] == [
            (JobStatus.COMPLETED, 1, T0 + 1),
            (JobStatus.ACTIVE, 0, T0),
            (JobStatus.COMPLETED, 1, T0 + 3),
            (JobStatus.COMPLETED, 1, T0 + 4),
        ]

    def test_two_runs_of_one_job_finishing_in_one_batch_complete_it(self, store: JobStore) -> None:
        runs = [make_run("job_1", T0, state=S.RUNNING, fence=1), make_run("job_1", T0 + 1, state=S.RUNNING, fence=1)]
        store.create_job(make_job("job_1"), runs)
        out = store.transition(
            [
                Transition(
                    r.run_id, frozenset({S.RUNNING}), S.SUCCEEDED, 1, at_ms=T0 + 9, job_status=JobStatus.COMPLETED
                )
                for r in runs
            ]
        )
        assert all(r is not None and r.state is S.SUCCEEDED for r in out)
        job = store.get_jobs([key("job_1")])[key("job_1")]
        assert (job.status, job.updated_ms) == (JobStatus.COMPLETED, T0 + 9)

    def test_a_run_that_does_not_decode_is_dead_lettered_in_a_batch_beside_healthy_runs(self, store: JobStore) -> None:
        store.add_runs([make_run("healthy_a", fence=4), make_run("healthy_b", fence=4)])
        write_poison_run(store, make_run("poison", fence=4))
        claimed = store.claim([f"healthy_a:{T0}", f"poison:{T0}", f"healthy_b:{T0}"], T0, "scanner", 5000)
        by_id = {r.run_id: r for r in claimed}
        assert by_id[f"poison:{T0}"].corrupt is not None
        dead = Transition(
            f"poison:{T0}",
            frozenset({S.CLAIMED}),
            S.FAILED,
            None,
            {"dead_letter": True, "last_error": "Corrupt"},
            bump_fence=True,
        )

        def dispatch(run_id: str) -> Transition:
            return Transition(run_id, frozenset({S.CLAIMED}), S.DISPATCHED, 5, {"dispatched_ms": T0})

        out = store.transition([dispatch(f"healthy_a:{T0}"), dead, dispatch(f"healthy_b:{T0}")])
        assert [None if r is None else (r.state, r.corrupt is None) for r in out] == [
            (S.DISPATCHED, True),
            (S.FAILED, False),
            (S.DISPATCHED, True),
        ]
        assert out[1] is not None and (out[1].dead_letter, out[1].last_error, out[1].fence) == (True, "Corrupt", 6)
        assert [r.run_id for r in store.list_runs(RunQuery(dead_letter=True)).items] == [f"poison:{T0}"]

    def test_a_corrupt_run_in_a_batch_of_one_shape_moves_like_the_others(self, store: JobStore) -> None:
        store.add_runs([make_run("healthy", state=S.RUNNING, fence=2)])
        write_poison_run(store, make_run("poison", state=S.RUNNING, fence=2))
        out = store.transition(
            [
                Transition(run_id, frozenset({S.RUNNING}), S.SCHEDULED, 2, bump_fence=True, at_ms=T0 + 1)
                for run_id in (f"poison:{T0}", f"healthy:{T0}")
            ]
        )
        assert [None if r is None else (r.run_id, r.state, r.fence, r.corrupt is None) for r in out] == [
            (f"poison:{T0}", S.SCHEDULED, 3, False),
            (f"healthy:{T0}", S.SCHEDULED, 3, True),
        ]


def test_create_jobs_writes_a_batch_and_skips_existing_ids(store: JobStore) -> None:
    store.create_job(make_job("job_1", name="first"), [])
    created = store.create_jobs(
        [
            (make_job("job_1", name="again"), [make_run("job_1", T0 + 7)]),
            (make_job("job_2"), [make_run("job_2")]),
            (make_job("job_3"), []),
        ]
    )
    assert created == [False, True, True]
    assert store.get_jobs([key("job_1")])[key("job_1")].name == "first"
    assert store.get_runs([f"job_1:{T0 + 7}"]) == {}
    assert set(store.get_runs([f"job_2:{T0}"])) == {f"job_2:{T0}"}
    assert set(store.get_jobs([key("job_2"), key("job_3")])) == {key("job_2"), key("job_3")}


def _job_ids(jobs: list[Job]) -> list[tuple[str, str]]:
    return [(j.tenant_id, j.job_id) for j in jobs]


class TestTwoTenantsOneJobId:
    """Job ids are scoped by tenant: (tenant, job id) is the key in every store."""

    def test_two_tenants_create_and_read_their_own_job_of_the_same_id(self, store: JobStore) -> None:
        store.create_job(make_job("shared", name="acme's", tenant_id="acme"), [make_run("shared", tenant_id="acme")])
        store.create_job(make_job("shared", name="globex's", tenant_id="globex"), [])
        jobs = store.get_jobs([key("shared", "acme"), key("shared", "globex"), key("shared")])
        assert {k: j.name for k, j in jobs.items()} == {
            key("shared", "acme"): "acme's",
            key("shared", "globex"): "globex's",
        }
        assert set(store.get_runs([f"acme/shared:{T0}"])) == {f"acme/shared:{T0}"}

    def test_a_job_id_is_refused_as_a_duplicate_only_within_its_tenant(self, store: JobStore) -> None:
        store.create_job(make_job("shared", tenant_id="acme"), [])
        with pytest.raises(DuplicateJob):
            store.create_job(make_job("shared", tenant_id="acme", name="again"), [])
        assert store.create_job(make_job("shared", tenant_id="globex"), []).created
        assert store.create_jobs([(make_job("shared", tenant_id="acme"), []), (make_job("shared"), [])]) == [
            False,
            True,
        ]

    def test_their_runs_are_listed_and_counted_apart(self, store: JobStore) -> None:
        store.create_job(
            make_job("shared", tenant_id="acme"), [make_run("shared", T0 + i, tenant_id="acme") for i in range(3)]
        )
        store.create_job(make_job("shared"), [make_run("shared", T0, state=S.FAILED)])
        acme = store.list_runs(RunQuery(job=key("shared", "acme"))).items
        assert [r.run_id for r in acme] == [f"acme/shared:{T0 + i}" for i in (2, 1, 0)]
        assert [r.run_id for r in store.list_runs(RunQuery(job=key("shared"))).items] == [f"shared:{T0}"]
        assert store.run_counts(key("shared", "acme")) == {S.SCHEDULED: 3}
        assert store.run_counts(key("shared")) == {S.FAILED: 1}
        assert store.run_counts(key("shared", "initech")) == {}

    def test_changing_one_tenants_job_leaves_the_others(self, store: JobStore) -> None:
        store.create_job(make_job("shared", tenant_id="acme"), [])
        store.create_job(make_job("shared", tenant_id="globex"), [])
        acme = store.get_jobs([key("shared", "acme")])[key("shared", "acme")]
        store.update_job(acme.model_copy(update={"name": "renamed"}))
        assert store.set_job_status(key("shared", "globex"), JobStatus.CANCELLED, frozenset({JobStatus.ACTIVE}), T0 + 5)
        jobs = store.get_jobs([key("shared", "acme"), key("shared", "globex")])
        assert (jobs[key("shared", "acme")].name, jobs[key("shared", "acme")].status) == ("renamed", JobStatus.ACTIVE)
        assert (jobs[key("shared", "globex")].name, jobs[key("shared", "globex")].status) == (
            "tests.noop",
            JobStatus.CANCELLED,
        )
        with pytest.raises(JobNotFound):
            store.update_job(make_job("shared", tenant_id="initech"))

    def test_a_final_outcome_completes_only_its_own_tenants_job(self, store: JobStore) -> None:
        store.create_job(make_job("shared", tenant_id="acme"), [make_run("shared", tenant_id="acme", state=S.RUNNING)])
        store.create_job(make_job("shared"), [make_run("shared", state=S.RUNNING)])
        done = Transition(f"acme/shared:{T0}", frozenset({S.RUNNING}), S.SUCCEEDED, 0, job_status=JobStatus.COMPLETED)
        assert store.transition([done])[0] is not None
        jobs = store.get_jobs([key("shared", "acme"), key("shared")])
        assert (jobs[key("shared", "acme")].status, jobs[key("shared")].status) == (
            JobStatus.COMPLETED,
            JobStatus.ACTIVE,
        )

    def test_the_same_idempotency_key_replays_each_tenants_own_job(self, store: JobStore) -> None:
        for tenant in ("acme", "globex"):
            record = idem(job_id="shared").model_copy(update={"tenant_id": tenant, "response": tenant})
            assert store.create_job(make_job("shared", tenant_id=tenant, name=tenant), [], record).created
        for tenant in ("acme", "globex"):
            record = idem(job_id="shared").model_copy(update={"tenant_id": tenant})
            again = store.create_job(make_job("other", tenant_id=tenant), [], record)
            assert (again.created, again.job.tenant_id, again.job.name, again.response) == (
                False,
                tenant,
                tenant,
                tenant,
            )

    def test_listing_every_tenant_orders_by_job_id_then_tenant_and_pages_over_both(self, store: JobStore) -> None:
        for tenant, job_id in [("globex", "b"), ("acme", "b"), ("acme", "a"), ("default", "b"), ("acme", "c")]:
            store.create_job(make_job(job_id, tenant_id=tenant), [])
        seen, cursor = [], None
        while True:
            page = store.list_jobs(JobQuery(cursor=cursor, limit=2))
            seen += _job_ids(page.items)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert seen == [("acme", "a"), ("acme", "b"), ("default", "b"), ("globex", "b"), ("acme", "c")]
        assert _job_ids(store.list_jobs(JobQuery(tenant_id="acme", limit=2)).items) == [("acme", "a"), ("acme", "b")]
        assert _job_ids(store.list_jobs(JobQuery(tenant_id="acme", cursor="b|acme")).items) == [("acme", "c")]
        # A cursor from before job ids were scoped by tenant (a bare id) goes on after that id.
        assert _job_ids(store.list_jobs(JobQuery(cursor="b")).items) == [("acme", "c")]

    def test_due_jobs_of_both_tenants_are_due(self, store: JobStore) -> None:
        store.create_job(make_job("shared", tenant_id="acme", next_fire_ms=T0), [])
        store.create_job(make_job("shared", next_fire_ms=T0 + 1), [])
        assert _job_ids(store.due_jobs(T0 + 1, 10)) == [("acme", "shared"), ("default", "shared")]


class TestSetJobStatus:
    def test_it_is_a_compare_and_set_on_the_status(self, store: JobStore) -> None:
        store.create_job(make_job("job_1"), [])
        assert not store.set_job_status(key("job_1"), JobStatus.CANCELLED, frozenset({JobStatus.PAUSED}), T0 + 1)
        assert store.set_job_status(key("job_1"), JobStatus.QUARANTINED, frozenset({JobStatus.ACTIVE}), T0 + 2, "why")
        assert not store.set_job_status(key("job_missing"), JobStatus.CANCELLED, frozenset(JobStatus), T0)
        job = store.get_jobs([key("job_1")])[key("job_1")]
        assert (job.status, job.status_reason, job.version, job.updated_ms) == (JobStatus.QUARANTINED, "why", 1, T0 + 2)
        assert store.list_jobs(JobQuery(status=JobStatus.QUARANTINED)).items[0].job_id == "job_1"

    def test_a_status_other_than_active_takes_the_job_out_of_due_jobs_and_back(self, store: JobStore) -> None:
        store.create_job(make_job("job_1", next_fire_ms=T0), [])
        store.set_job_status(key("job_1"), JobStatus.QUARANTINED, frozenset({JobStatus.ACTIVE}), T0)
        assert store.due_jobs(T0, 10) == []
        store.set_job_status(key("job_1"), JobStatus.ACTIVE, frozenset({JobStatus.QUARANTINED}), T0)
        assert [j.job_id for j in store.due_jobs(T0, 10)] == ["job_1"]

    def test_it_changes_a_job_whose_record_does_not_decode(self, store: JobStore) -> None:
        write_poison_job(store, make_job("poison", next_fire_ms=T0))
        assert store.set_job_status(key("poison"), JobStatus.CANCELLED, frozenset({JobStatus.ACTIVE}), T0 + 3)
        job = store.get_jobs([key("poison")])[key("poison")]
        assert job.corrupt is not None and "max_retries" in job.corrupt  # the record itself is left as it was
        assert (job.status, job.version) == (JobStatus.CANCELLED, 1)
        assert store.due_jobs(T0, 10) == []


class TestRecordsThatDoNotDecode:
    """A row written by an older version, by hand or by a bug is read as a corrupt marker."""

    def test_a_job_that_does_not_decode_is_read_as_a_marker_beside_the_others(self, store: JobStore) -> None:
        store.create_job(make_job("healthy", next_fire_ms=T0), [])
        write_poison_job(store, make_job("poison", tenant_id="acme", name="poisoned", next_fire_ms=T0))
        poison = store.get_jobs([key("poison", "acme")])[key("poison", "acme")]
        assert poison.corrupt is not None and poison.corrupt.startswith("retry.max_retries:")
        assert (poison.job_id, poison.tenant_id, poison.name, poison.status) == (
            "poison",
            "acme",
            "poisoned",
            JobStatus.ACTIVE,
        )
        assert poison.schedule.at_ms == T0  # the parts of the document that decode are kept
        assert [(j.job_id, j.corrupt is None) for j in store.due_jobs(T0, 10)] == [("healthy", True), ("poison", False)]
        assert [(j.job_id, j.corrupt is None) for j in store.list_jobs(JobQuery()).items] == [
            ("healthy", True),
            ("poison", False),
        ]

    def test_a_marker_is_never_written_back_whole(self, store: JobStore) -> None:
        write_poison_job(store, make_job("poison"))
        poison = store.get_jobs([key("poison")])[key("poison")]
        with pytest.raises(Conflict):
            store.update_job(poison.model_copy(update={"status": JobStatus.PAUSED}))

    def test_a_run_that_does_not_decode_is_read_as_a_marker_beside_the_others(self, store: JobStore) -> None:
        store.add_runs([make_run("healthy", state=S.RUNNING, fence=2, lease_expires_ms=T0 - 1)])
        bad = write_poison_run(store, make_run("poison", state=S.RUNNING, fence=3, lease_expires_ms=T0 - 2))
        [poison, healthy] = store.expired_leases(T0, 10)
        assert poison.corrupt is not None and poison.corrupt.startswith(f"{bad}:")
        assert (poison.run_id, poison.job_id, poison.state, poison.fence) == (f"poison:{T0}", "poison", S.RUNNING, 3)
        assert healthy.corrupt is None and healthy.run_id == f"healthy:{T0}"
        assert store.get_runs([f"poison:{T0}"])[f"poison:{T0}"].corrupt is not None
        assert [(r.job_id, r.corrupt is None) for r in store.list_runs(RunQuery()).items] == [
            ("poison", False),
            ("healthy", True),
        ]
        assert store.run_counts(key("poison")) == {S.RUNNING: 1}

    def test_a_run_that_does_not_decode_can_be_claimed_and_dead_lettered_by_its_state(self, store: JobStore) -> None:
        write_poison_run(store, make_run("poison", fence=4))
        [claimed] = store.claim([f"poison:{T0}"], T0, "scanner", 5000)
        assert claimed.corrupt is not None and (claimed.state, claimed.fence) == (S.CLAIMED, 5)
        dead = Transition(
            claimed.run_id,
            frozenset({S.CLAIMED}),
            S.FAILED,
            None,
            {"dead_letter": True, "last_error": "Corrupt"},
            bump_fence=True,
        )
        [moved] = store.transition([dead])
        assert moved is not None and (moved.state, moved.dead_letter, moved.last_error) == (S.FAILED, True, "Corrupt")
        assert [r.run_id for r in store.list_runs(RunQuery(dead_letter=True)).items] == [f"poison:{T0}"]


# The jobs table of the version before job ids were scoped by tenant: keyed by job_id alone.
_PREVIOUS_JOBS_TABLE = """
CREATE TABLE jobq_jobs (
    job_id       TEXT PRIMARY KEY,
    tenant_id    TEXT NOT NULL,
    name         TEXT NOT NULL,
    status       TEXT NOT NULL,
    priority     INTEGER NOT NULL,
    next_fire_ms INTEGER,
    version      INTEGER NOT NULL,
    doc          TEXT NOT NULL
);
CREATE INDEX jobq_jobs_due ON jobq_jobs (next_fire_ms) WHERE status = 'ACTIVE' AND next_fire_ms IS NOT NULL;
CREATE INDEX jobq_jobs_tenant ON jobq_jobs (tenant_id, job_id);
DROP INDEX jobq_runs_job_key;
CREATE INDEX jobq_runs_job ON jobq_runs (job_id, nominal_ms);
"""


def test_a_sqlite_file_of_the_previous_version_is_upgraded_in_place_with_its_data(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    SqliteStore(SqliteDatabase(path)).close()  # the other tables, as they were
    raw = sqlite3.connect(path)
    with raw:
        raw.execute("DROP TABLE jobq_jobs")
        raw.executescript(_PREVIOUS_JOBS_TABLE)
        for tenant, job_id in (("default", "nightly"), ("acme", "report")):
            job = make_job(job_id, tenant_id=tenant)
            raw.execute(
                "INSERT INTO jobq_jobs VALUES (?, ?, ?, 'ACTIVE', 2, ?, 0, ?)",
                (job_id, tenant, job.name, T0, job.model_dump_json()),
            )
            # The previous version named runs job_id:ms whatever the tenant; those ids stay valid.
            values = [f"{job_id}:{T0}", job_id, tenant, T0, T0, 2, "SCHEDULED", 1, 0, 0, 0, 0]
            raw.execute(
                "INSERT INTO jobq_runs (run_id, job_id, tenant_id, nominal_ms, due_ms, priority, state, attempt, "
                "fence, version, created_ms, updated_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                values,
            )
    with pytest.raises(sqlite3.IntegrityError):  # one job id for every tenant: the old key
        raw.execute("INSERT INTO jobq_jobs VALUES ('report', 'default', 'x', 'ACTIVE', 2, NULL, 0, '{}')")
    raw.close()

    opened: list[SqliteStore] = []
    threads = [threading.Thread(target=lambda: opened.append(SqliteStore(SqliteDatabase(path)))) for _ in range(3)]
    for t in threads:  # several processes may start on the old file at once
        t.start()
    for t in threads:
        t.join()
    assert len(opened) == 3
    store = opened[0]
    jobs = store.get_jobs([key("nightly"), key("report", "acme"), key("report")])
    assert set(jobs) == {key("nightly"), key("report", "acme")}
    assert [r.run_id for r in store.list_runs(RunQuery(job=key("report", "acme"))).items] == [f"report:{T0}"]
    assert store.run_counts(key("report", "acme")) == {S.SCHEDULED: 1}
    assert store.create_job(make_job("report"), []).created  # free in `default` now
    with pytest.raises(DuplicateJob):
        store.create_job(make_job("report", tenant_id="acme"), [])
    assert [j.job_id for j in store.due_jobs(T0, 10)] == ["nightly", "report", "report"]
    indexes = {r["name"] for r in store.db.read("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"jobq_jobs_due_tier", "jobq_jobs_id", "jobq_runs_job_key"} <= indexes
    assert not {"jobq_jobs_due", "jobq_jobs_tenant", "jobq_runs_job"} & indexes
    for s in opened:
        s.close()


def test_a_run_counts_its_hand_backs(store: JobStore) -> None:
    """`handbacks` starts at 0 and a transition may change it, on every backend."""
    job = make_job("hb")
    run = make_run("hb", state=RunState.DISPATCHED, fence=1)
    store.create_job(job, [run])
    assert store.get_runs([run.run_id])[run.run_id].handbacks == 0
    [moved] = store.transition(
        [
            Transition(
                run.run_id,
                frozenset({RunState.DISPATCHED}),
                RunState.SCHEDULED,
                1,
                {"handbacks": 1, "lease_owner": None, "lease_expires_ms": None},
                bump_fence=True,
            )
        ]
    )
    assert moved is not None and (moved.handbacks, moved.fence) == (1, 2)
    assert store.get_runs([run.run_id])[run.run_id].handbacks == 1


class TestResultExpiry:
    """Results outlive their run's finish by `result_ttl_s`; the reaper calls `expire_results`."""

    def _finish(self, store: JobStore, job_id: str, to: RunState, finished_ms: int, result: object) -> str:
        run_id = f"{job_id}:{T0}"
        store.add_runs([make_run(job_id, fence=1, state=S.RUNNING, lease_owner="w1")])
        changes = {"result": result, "finished_ms": finished_ms, "lease_expires_ms": None}
        assert _move(store, run_id, {S.RUNNING}, to, 1, **changes) is not None
        return run_id

    def _result(self, store: JobStore, run_id: str) -> object:
        return store.get_runs([run_id])[run_id].result

    def test_results_of_runs_finished_before_the_bound_are_cleared_and_counted(self, store: JobStore) -> None:
        old = self._finish(store, "job_old", S.SUCCEEDED, T0 + 10, {"total": 5})
        failed = self._finish(store, "job_failed", S.FAILED, T0 + 11, {"status": 500, "body": "x"})
        young = self._finish(store, "job_young", S.SUCCEEDED, T0 + 20, 7)
        self._finish(store, "job_none", S.SUCCEEDED, T0 + 1, None)
        assert store.expire_results(T0 + 15, 100) == 2
        assert (self._result(store, old), self._result(store, failed), self._result(store, young)) == (None, None, 7)
        assert store.get_runs([old])[old].state is S.SUCCEEDED  # the run stays; only its result goes

    def test_expiring_again_clears_nothing(self, store: JobStore) -> None:
        self._finish(store, "job_old", S.SUCCEEDED, T0 + 10, 1)
        assert store.expire_results(T0 + 15, 100) == 1
        assert store.expire_results(T0 + 15, 100) == 0

    def test_expiry_takes_the_oldest_first_up_to_the_limit(self, store: JobStore) -> None:
        first = self._finish(store, "job_a", S.SUCCEEDED, T0 + 10, 1)
        second = self._finish(store, "job_b", S.SUCCEEDED, T0 + 12, 2)
        assert store.expire_results(T0 + 15, 1) == 1
        assert (self._result(store, first), self._result(store, second)) == (None, 2)

    def test_a_run_not_finished_keeps_its_result(self, store: JobStore) -> None:
        run_id = self._finish(store, "job_x", S.FAILED, T0 + 10, {"status": 503, "body": ""})
        redriven = _move(store, run_id, {S.FAILED}, S.SCHEDULED, 1, finished_ms=None, due_ms=T0 + 30)
        assert redriven is not None
        assert store.expire_results(T0 + 100, 100) == 0
        assert self._result(store, run_id) == {"status": 503, "body": ""}


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_job_and_its_runs_keep_their_trace_context(store: JobStore) -> None:
    """The submitter's W3C traceparent is stored with the job and with each run, on every backend,
    and survives the run's transitions (retries and reclaims continue the same trace)."""
    job = make_job("traced").model_copy(update={"trace": TRACEPARENT})
    run = make_run("traced", trace=TRACEPARENT)
    untraced = make_run("traced", T0 + 1000)
    store.create_job(job, [run, untraced])
    assert store.get_jobs([key("traced")])[key("traced")].trace == TRACEPARENT
    stored = store.get_runs([run.run_id, untraced.run_id])
    assert (stored[run.run_id].trace, stored[untraced.run_id].trace) == (TRACEPARENT, None)
    [moved] = store.transition(
        [Transition(run.run_id, frozenset({RunState.SCHEDULED}), RunState.CLAIMED, 0, bump_fence=True)]
    )
    assert moved is not None and moved.trace == TRACEPARENT
    assert store.get_runs([run.run_id])[run.run_id].trace == TRACEPARENT
    later = make_run("traced", T0 + 2000, trace=TRACEPARENT)
    assert [r.trace for r in store.add_runs([later])] == [TRACEPARENT]


def test_a_sqlite_file_without_the_trace_column_gains_it_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    SqliteStore(SqliteDatabase(path)).close()
    raw = sqlite3.connect(path)
    with raw:
        raw.execute("ALTER TABLE jobq_runs DROP COLUMN trace")  # as the previous version made it
        raw.execute(
            "INSERT INTO jobq_runs (run_id, job_id, tenant_id, nominal_ms, due_ms, priority, state, attempt, "
            "fence, version, created_ms, updated_ms) VALUES (?, 'old', 'default', ?, ?, 2, 'SCHEDULED', 1, 0, 0, 0, 0)",
            (f"old:{T0}", T0, T0),
        )
    raw.close()
    store = SqliteStore(SqliteDatabase(path))
    try:
        assert store.get_runs([f"old:{T0}"])[f"old:{T0}"].trace is None
        store.create_job(make_job("new"), [make_run("new", trace=TRACEPARENT)])
        assert store.get_runs([f"new:{T0}"])[f"new:{T0}"].trace == TRACEPARENT
    finally:
        store.close()


def test_a_sqlite_file_of_an_earlier_version_gets_the_task_catalogue_when_opened(tmp_path: Path) -> None:
    first = SqliteStore(SqliteDatabase(tmp_path / "s.db"))
    first.create_job(make_job("job_1"), [make_run("job_1")])
    with first.db.write() as conn:
        conn.execute("DROP TABLE jobq_tasks")  # as a file written before the catalogue existed
    first.close()
    second = SqliteStore(SqliteDatabase(tmp_path / "s.db"))
    second.publish_tasks([TaskInfo(name="t.a", priority=Priority.HIGH, published_ms=T0)])
    assert second.task_catalogue()["t.a"].priority is Priority.HIGH
    assert set(second.get_jobs([key("job_1")])) == {key("job_1")}


class TestMaterialisation:
    """What beat needs from a store: due jobs by tier and shard, and a batch of advances."""

    def test_due_jobs_come_critical_first_even_behind_a_larger_backlog_of_earlier_low_jobs(
        self, store: JobStore
    ) -> None:
        low = [make_job(f"low_{i}", next_fire_ms=T0 + i, priority=Priority.LOW) for i in range(6)]
        store.create_jobs([(job, []) for job in low])
        store.create_job(make_job("high", next_fire_ms=T0 + 50, priority=Priority.HIGH), [])
        store.create_job(make_job("critical", next_fire_ms=T0 + 90, priority=Priority.CRITICAL), [])
        store.create_job(make_job("later", next_fire_ms=T0 + 500, priority=Priority.CRITICAL), [])
        assert [j.job_id for j in store.due_jobs(T0 + 100, 3)] == ["critical", "high", "low_0"]
        assert [j.job_id for j in store.due_jobs(T0 + 100, 100)][2:] == [f"low_{i}" for i in range(6)]

    def test_due_jobs_of_each_shard_partition_the_due_jobs(self, store: JobStore) -> None:
        store.create_jobs([(make_job(f"job_{i:02d}", next_fire_ms=T0 + i), []) for i in range(40)])
        by_shard = [{j.job_id for j in store.due_jobs(T0 + 100, 100, shards=[s])} for s in range(JOB_SHARDS)]
        assert set().union(*by_shard) == {f"job_{i:02d}" for i in range(40)}
        assert sum(len(ids) for ids in by_shard) == 40  # no job in two shards
        assert sum(1 for ids in by_shard if ids) > 1  # the jobs do spread
        halves = [set(range(0, 16, 2)), set(range(1, 16, 2))]
        assert sum(len(store.due_jobs(T0 + 100, 100, shards=h)) for h in halves) == 40
        assert store.due_jobs(T0 + 100, 100, shards=[]) == []

    def test_advance_jobs_moves_the_jobs_whose_version_holds_and_stores_their_runs(self, store: JobStore) -> None:
        store.create_jobs([(make_job("fresh"), []), (make_job("stale"), [])])
        fresh, stale = (store.get_jobs([key(i)])[key(i)] for i in ("fresh", "stale"))
        store.update_job(stale.model_copy(update={"name": "moved by another beat"}))
        done = {"next_fire_ms": None, "last_run_id": f"fresh:{T0}"}
        result = store.advance_jobs(
            [
                (fresh.model_copy(update=done), [make_run("fresh")]),
                (stale.model_copy(update={"next_fire_ms": None}), [make_run("stale")]),
                (make_job("gone", version=1), [make_run("gone")]),
            ]
        )
        assert result == [True, False, False]
        jobs = store.get_jobs([key("fresh"), key("stale")])
        assert (jobs[key("fresh")].version, jobs[key("fresh")].next_fire_ms) == (fresh.version + 1, None)
        assert (jobs[key("stale")].name, jobs[key("stale")].next_fire_ms) == ("moved by another beat", T0)
        assert f"fresh:{T0}" in store.get_runs([f"fresh:{T0}"])
        if not hasattr(store, "table"):  # not DynamoDB, which puts the runs before the advances (see the port)
            assert store.get_runs([f"stale:{T0}", f"gone:{T0}"]) == {}

    def test_advance_jobs_leaves_runs_that_exist_untouched(self, store: JobStore) -> None:
        store.create_job(make_job("job_1"), [make_run("job_1", state=RunState.CLAIMED, fence=3)])
        job = store.get_jobs([key("job_1")])[key("job_1")]
        later = make_run("job_1", T0 + 60_000)
        assert store.advance_jobs([(job.model_copy(update={"next_fire_ms": T0 + 120_000}), [make_run("job_1"), later])])
        runs = store.get_runs([f"job_1:{T0}", later.run_id])
        assert (runs[f"job_1:{T0}"].state, runs[f"job_1:{T0}"].fence) == (RunState.CLAIMED, 3)
        assert runs[later.run_id].state is RunState.SCHEDULED
        assert store.advance_jobs([(job, [])]) == [False]  # the same version again: refused
