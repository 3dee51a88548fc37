"""The PostgreSQL backends beyond the store contract: the fused claim, migrations, query plans,
history, the time-index view, error translation, and the whole run lifecycle on PostgreSQL.

Every test works in schemas of its own (dropped afterwards). Skipped without a server on
127.0.0.1:5432, failed in CI. The lifecycle tests of `test_lifecycle` are imported at the end:
pytest collects them here, where their `h` fixture is a deployment on PostgreSQL.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from factories import T0, key, make_job, make_run
from harness import Harness
from services import free_port, require_postgres

from jobq.clock import ManualClock
from jobq.deployment import Deployment
from jobq.errors import ConfigError, DuplicateJob, JobqError, StoreError, StoreUnavailable
from jobq.metrics import METRICS
from jobq.models import IdempotencyRecord, JobStatus, Priority, RunEvent, RunState, Transition
from jobq.ports import ClaimingIndex, IndexEntry, RunQuery
from jobq.settings import Settings
from jobq.transport.memory import MemoryTransport

try:
    import psycopg
except ImportError:  # like a missing server: skipped locally, a failure in CI
    if os.environ.get("CI") == "true":
        raise
    pytest.skip("psycopg is not installed: pip install 'jobq[postgres]'", allow_module_level=True)

from jobq.history.postgres import PostgresHistory  # after the skip: these need psycopg
from jobq.postgresdb import PostgresConfig, PostgresDatabase, migrations
from jobq.store.postgres import PostgresStore
from jobq.timeindex.postgres import PostgresTimeIndex

S = RunState

ALL_VERSIONS = [m.version for m in migrations()]
LATEST = ALL_VERSIONS[-1]


@pytest.fixture(scope="module")
def dsn() -> str:
    return require_postgres()


@pytest.fixture
def schema_url(dsn: str) -> Iterator[Callable[..., str]]:
    """Factory: the URL of a fresh schema (extra query parameters as keywords). Every schema it
    named is dropped after the test, whatever the test did."""
    made: list[str] = []

    def url(**params: Any) -> str:
        schema = f"jobq_test_{uuid.uuid4().hex[:12]}"
        made.append(schema)
        query = "&".join(f"{k}={quote(str(v))}" for k, v in {"schema": schema, **params}.items())
        return f"{dsn}?{query}"

    yield url
    with psycopg.connect(dsn, autocommit=True) as conn:
        for schema in made:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def open_store(schema_url: Callable[..., str]) -> Iterator[Callable[..., PostgresStore]]:
    """Factory: a store on `url` (default: a fresh schema), closed after the test."""
    stores: list[PostgresStore] = []

    def open_(url: str | None = None) -> PostgresStore:
        store = PostgresStore.from_url(url or schema_url(pool_max=8))
        stores.append(store)
        return store

    yield open_
    for store in stores:
        store.close()


@pytest.fixture
def store(open_store: Callable[..., PostgresStore]) -> PostgresStore:
    return open_store()


def execute(store: PostgresStore, template: str, params: Any = ()) -> list[dict[str, Any]]:
    """Run one statement on the store's schema from outside the store (set-up and checks)."""

    def body(conn: Any) -> list[dict[str, Any]]:
        cur = conn.execute(store.db.sql(template), params)
        return cur.fetchall() if cur.description else []

    return store.db.run(body)


def due_runs(n: int, *, job: str = "job", due_ms: int = T0, **overrides: Any) -> list[Any]:
    return [make_run(f"{job}_{i:05d}", T0, due_ms=due_ms, **overrides) for i in range(n)]


# -- the fused claim (ClaimingIndex.claim_runs) ---------------------------------------------------


class TestFusedClaim:
    def test_it_claims_critical_first_then_by_due_time_up_to_the_limit(self, store: PostgresStore) -> None:
        store.add_runs(
            [
                make_run("job_low", T0, due_ms=T0 - 500, priority=Priority.LOW),
                make_run("job_def", T0, due_ms=T0 - 10, priority=Priority.DEFAULT),
                make_run("job_crit_late", T0, due_ms=T0, priority=Priority.CRITICAL),
                make_run("job_crit_early", T0, due_ms=T0 - 1, priority=Priority.CRITICAL),
                make_run("job_future", T0, due_ms=T0 + 1, priority=Priority.CRITICAL),
            ]
        )
        claimed = store.claim_due(T0, 3, "scanner-1", 5_000)
        assert [r.job_id for r in claimed] == ["job_crit_early", "job_crit_late", "job_def"]
        assert {(r.state, r.fence, r.version, r.lease_owner, r.lease_expires_ms, r.updated_ms) for r in claimed} == {
            (S.CLAIMED, 1, 1, "scanner-1", T0 + 5_000, T0)
        }
        assert [r.job_id for r in store.claim_due(T0, 10, "scanner-1", 5_000)] == ["job_low"]
        assert store.claim_due(T0, 10, "scanner-1", 5_000) == []

    def test_future_and_parked_runs_of_a_higher_tier_do_not_hide_a_due_lower_one(self, store: PostgresStore) -> None:
        store.add_runs(due_runs(300, job="crit_future", due_ms=T0 + 60_000, priority=Priority.CRITICAL))
        store.add_runs(due_runs(300, job="crit_parked", due_ms=2**62, priority=Priority.CRITICAL))
        store.add_runs([make_run("job_low", T0, priority=Priority.LOW)])
        assert [r.job_id for r in store.claim_due(T0, 10, "s", 1_000)] == ["job_low"]

    def test_only_scheduled_runs_are_claimed(self, store: PostgresStore) -> None:
        store.add_runs(
            [make_run(f"job_{s.value.lower()}", T0, state=s, fence=3) for s in RunState if s is not S.SCHEDULED]
        )
        assert store.claim_due(T0 + 1_000_000, 100, "s", 1_000) == []

    def test_four_concurrent_scanners_claim_each_of_2000_runs_exactly_once(
        self, schema_url: Callable[..., str], open_store: Callable[..., PostgresStore]
    ) -> None:
        url = schema_url(pool_max=2)
        scanners = [open_store(url) for _ in range(4)]  # four pools, as four scanner processes would have
        runs = due_runs(2_000, priority=Priority.HIGH) + due_runs(100, job="future", due_ms=T0 + 1)
        scanners[0].add_runs(runs)
        got: list[list[str]] = [[] for _ in scanners]
        start = threading.Barrier(len(scanners))

        def scan(n: int) -> None:
            start.wait()
            while batch := scanners[n].claim_due(T0, 37, f"scanner-{n}", 30_000):
                got[n] += [r.run_id for r in batch]

        threads = [threading.Thread(target=scan, args=(n,)) for n in range(len(scanners))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        everything = [run_id for ids in got for run_id in ids]
        assert len(everything) == 2_000
        assert set(everything) == {r.run_id for r in runs[:2_000]}
        fences = execute(scanners[0], "SELECT state, fence, count(*) AS n FROM {runs} GROUP BY state, fence")
        assert sorted((r["state"], r["fence"], r["n"]) for r in fences) == [
            ("CLAIMED", 1, 2_000),
            ("SCHEDULED", 0, 100),
        ]

    def test_runs_locked_by_another_transaction_are_skipped_without_waiting(
        self, dsn: str, schema_url: Callable[..., str], open_store: Callable[..., PostgresStore]
    ) -> None:
        # lock_timeout makes a claim that did wait fail loudly instead of hanging the test.
        store = open_store(schema_url(options="-c lock_timeout=3000"))
        store.add_runs(due_runs(10, priority=Priority.CRITICAL))
        locked = [f"job_{i:05d}:{T0}" for i in range(0, 10, 2)]
        with psycopg.connect(dsn) as other:  # not autocommit: holds its row locks until rollback
            other.execute(
                f'SELECT run_id FROM "{store.db.schema}".jobq_runs WHERE run_id = ANY(%s) FOR UPDATE', [locked]
            )
            started = time.monotonic()
            claimed = store.claim_due(T0, 100, "scanner", 1_000)
            elapsed = time.monotonic() - started
            other.rollback()
        assert elapsed < 1.0
        assert {r.run_id for r in claimed} == {f"job_{i:05d}:{T0}" for i in range(1, 10, 2)}
        assert {r.run_id for r in store.claim_due(T0, 100, "scanner", 1_000)} == set(locked)

    def test_a_claim_by_id_waits_for_a_rival_and_skips_the_run_it_cancelled(
        self, dsn: str, store: PostgresStore
    ) -> None:
        store.add_runs([make_run("job_1")])
        result: list[Any] = []
        with psycopg.connect(dsn) as other:
            other.execute(
                f"UPDATE \"{store.db.schema}\".jobq_runs SET state = 'CANCELLED', fence = fence + 1 WHERE run_id = %s",
                [f"job_1:{T0}"],
            )
            claimer = threading.Thread(target=lambda: result.append(store.claim([f"job_1:{T0}"], T0, "s", 1_000)))
            claimer.start()
            claimer.join(0.3)
            assert claimer.is_alive()  # waiting for the row lock: the rival's outcome decides
            other.commit()
        claimer.join(5)
        assert result == [[]]
        assert store.get_runs([f"job_1:{T0}"])[f"job_1:{T0}"].state is S.CANCELLED

    def test_the_claim_plan_reads_the_partial_due_index(self, store: PostgresStore) -> None:
        # 60,000 runs, 2,000 of them due: a sequential scan would read them all.
        execute(
            store,
            "INSERT INTO {runs} (run_id, job_id, tenant_id, nominal_ms, due_ms, priority, state, attempt, fence, "
            "version, created_ms, updated_ms) SELECT 'job_' || g || ':1', 'job_' || g, 'default', 1, "
            "CASE WHEN g %% 30 = 0 THEN %(t0)s - g ELSE %(t0)s + g END, g %% 4, "
            "CASE WHEN g %% 3 = 0 THEN 'SCHEDULED' ELSE 'SUCCEEDED' END, 1, 0, 0, 1, 1 "
            "FROM generate_series(1, 60000) AS g",
            {"t0": T0},
        )
        execute(store, "ANALYZE {runs}")
        plan = store.explain_claim_due(T0, 100)
        assert "Index Scan using jobq_runs_due" in plan, plan
        assert "Seq Scan" not in plan, plan
        assert "LockRows" in plan, plan  # FOR UPDATE SKIP LOCKED, inside the per-tier scan
        analyzed = store.explain_claim_due(T0, 100, analyze=True)
        assert "Seq Scan" not in analyzed, analyzed
        claimed = execute(store, "SELECT count(*) AS n FROM {runs} WHERE state = 'CLAIMED'")
        assert claimed == [{"n": 0}]  # EXPLAIN ANALYZE ran the claim in a rolled-back transaction


# -- store details the contract suite does not cover ---------------------------------------------


class TestStore:
    def test_a_transition_with_a_job_status_completes_an_active_job_in_the_same_write(
        self, store: PostgresStore
    ) -> None:
        store.create_job(make_job("job_1"), [make_run("job_1", state=S.RUNNING, fence=1)])
        t = Transition(
            f"job_1:{T0}", frozenset({S.RUNNING}), S.SUCCEEDED, 1, at_ms=T0 + 5, job_status=JobStatus.COMPLETED
        )
        [run] = store.transition([t])
        assert run is not None and run.state is S.SUCCEEDED
        job = store.get_jobs([key("job_1")])[key("job_1")]
        assert (job.status, job.version, job.updated_ms) == (JobStatus.COMPLETED, 1, T0 + 5)
        [row] = execute(store, "SELECT status, version FROM {jobs} WHERE job_id = 'job_1'")
        assert (row["status"], row["version"]) == ("COMPLETED", 1)  # the columns match the document

    def test_a_job_status_leaves_a_paused_job_alone_and_needs_the_run_transition_to_apply(
        self, store: PostgresStore
    ) -> None:
        store.create_job(make_job("job_p", status=JobStatus.PAUSED), [make_run("job_p", state=S.RUNNING, fence=1)])
        store.create_job(make_job("job_a"), [make_run("job_a", state=S.RUNNING, fence=1)])
        done = frozenset({S.RUNNING})
        out = store.transition(
            [
                Transition(f"job_p:{T0}", done, S.SUCCEEDED, 1, job_status=JobStatus.COMPLETED),
                Transition(f"job_a:{T0}", done, S.SUCCEEDED, 9, job_status=JobStatus.COMPLETED),  # fence moved
            ]
        )
        assert out[0] is not None and out[1] is None
        jobs = store.get_jobs([key("job_p"), key("job_a")])
        assert (jobs[key("job_p")].status, jobs[key("job_p")].version) == (JobStatus.PAUSED, 0)
        assert (jobs[key("job_a")].status, jobs[key("job_a")].version) == (JobStatus.ACTIVE, 0)

    def test_batches_touching_the_same_runs_in_opposite_orders_do_not_deadlock(self, store: PostgresStore) -> None:
        runs = due_runs(20, state=S.RUNNING)
        store.add_runs(runs)
        errors: list[BaseException] = []

        def heartbeat(order: list[Any]) -> None:
            try:
                for i in range(40):
                    moves = [
                        Transition(r.run_id, frozenset({S.RUNNING}), S.RUNNING, 0, {"lease_expires_ms": i})
                        for r in order
                    ]
                    assert all(store.transition(moves))
            except BaseException as exc:  # reported below, not lost in the thread
                errors.append(exc)

        threads = [threading.Thread(target=heartbeat, args=(o,)) for o in (runs, runs[::-1])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert {r.version for r in store.get_runs([r.run_id for r in runs]).values()} == {80}

    def test_large_and_small_batches_of_different_shapes_on_the_same_runs_do_not_deadlock(
        self, store: PostgresStore
    ) -> None:
        # A 400-row batch may be planned with a hash join (which locks rows in table order) and a
        # 40-row one with a nested loop: unless every batch locks in one order, they deadlock.
        runs = due_runs(400, state=S.RUNNING)
        store.add_runs(runs)
        errors: list[BaseException] = []

        def beat(size: int, change: str, seed: int) -> None:
            rng = random.Random(seed)
            try:
                for i in range(15):
                    chosen = rng.sample(runs, size)
                    moves = [Transition(r.run_id, frozenset({S.RUNNING}), S.RUNNING, 0, {change: i}) for r in chosen]
                    assert all(store.transition(moves))
            except BaseException as exc:  # reported below, not lost in the thread
                errors.append(exc)

        work = [(400, "lease_expires_ms", 1), (40, "last_heartbeat_ms", 2), (40, "last_heartbeat_ms", 3)]
        threads = [threading.Thread(target=beat, args=args) for args in work]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []

    def test_a_batch_reaches_its_runs_by_primary_key_even_when_statistics_say_none_are_in_that_state(
        self, store: PostgresStore
    ) -> None:
        # Analyzed while every run was SCHEDULED, the statistics say no run is CLAIMED. A condition
        # on state alone would then start from the lease index and compare every claimed run with
        # every row of the batch; the statement must instead look each row up by its run id.
        runs = due_runs(2000)
        store.add_runs(runs)
        store.analyze()
        assert execute(store, "SELECT last_analyze FROM pg_stat_user_tables WHERE relid = '{runs}'::regclass")[0][
            "last_analyze"
        ]
        claimed = store.claim([r.run_id for r in runs[:500]], T0, "scanner", 30_000)
        moves = [
            Transition(r.run_id, frozenset({S.CLAIMED}), S.DISPATCHED, r.fence, {"dispatched_ms": T0}, at_ms=T0)
            for r in claimed
        ]
        sql, params = store._group_sql(moves)

        def plan(conn: Any) -> str:
            conn.execute("SET LOCAL enable_hashjoin = off")
            conn.execute("SET LOCAL enable_mergejoin = off")
            rows = conn.execute(f"EXPLAIN (COSTS OFF) {sql}", params).fetchall()
            return "\n".join(str(r["QUERY PLAN"]) for r in rows)

        text = store.db.run(plan)
        assert "jobq_runs_pkey" in text and "Join Filter" not in text, text
        assert all(store.transition(moves))

    def test_transition_batches_are_not_planned_again_at_every_batch(
        self, open_store: Callable[..., PostgresStore], schema_url: Callable[..., str]
    ) -> None:
        # psycopg prepares a statement from its sixth execution on; PostgreSQL then still plans it
        # afresh at every execution (a custom plan) unless a generic plan is as cheap, which an
        # array parameter's estimate never is: planning was most of the server's CPU for a small
        # batch. One connection, so every batch below runs on the connection that is looked at.
        store = open_store(schema_url(pool_max=1, pool_min=1))
        runs = due_runs(40, state=S.RUNNING, fence=1)
        store.add_runs(runs)
        for i in range(0, 40, 2):
            moves = [Transition(r.run_id, frozenset({S.RUNNING}), S.RUNNING, 1, {"last_heartbeat_ms": i}) for r in runs]
            assert all(store.transition(moves[i : i + 2]))
        [plans] = execute(
            store,
            "SELECT sum(generic_plans) AS generic, sum(custom_plans) AS custom FROM pg_prepared_statements "
            "WHERE statement LIKE 'WITH t AS (SELECT * FROM unnest(%%'",
        )
        assert (plans["generic"], plans["custom"]) == (15, 0)

    def test_the_generic_plan_of_a_batch_reaches_its_runs_by_primary_key(self, store: PostgresStore) -> None:
        # The plan every execution uses once the statement is prepared, with statistics that say
        # no run is CLAIMED (as in the test above): a nested loop over the batch's rows, each run
        # looked up by its id. The parameters are NULL: a generic plan does not depend on them.
        runs = due_runs(2000)
        store.add_runs(runs)
        store.analyze()
        claimed = store.claim([r.run_id for r in runs[:500]], T0, "scanner", 30_000)
        moves = [
            Transition(r.run_id, frozenset({S.CLAIMED}), S.DISPATCHED, r.fence, {"dispatched_ms": T0}, at_ms=T0)
            for r in claimed
        ]
        sql, params = store._group_sql(moves)
        with store.db.connection() as conn, conn.transaction(force_rollback=True):
            conn.execute("SET LOCAL enable_hashjoin = off")
            conn.execute("SET LOCAL enable_mergejoin = off")
            conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            conn.execute(sql, params, prepare=True)
            prepared = conn.execute(
                "SELECT name, parameter_types FROM pg_prepared_statements WHERE statement LIKE 'WITH t AS%'"
            ).fetchone()
            nulls = ", ".join("NULL" for _ in prepared["parameter_types"])
            rows = conn.execute(f"EXPLAIN (COSTS OFF) EXECUTE {prepared['name']}({nulls})").fetchall()
        text = "\n".join(str(r["QUERY PLAN"]) for r in rows)
        assert "Nested Loop" in text and "jobq_runs_pkey" in text and "Join Filter" not in text, text

    def test_concurrent_requests_with_one_idempotency_key_create_one_job(self, store: PostgresStore) -> None:
        def record(job_id: str) -> IdempotencyRecord:
            return IdempotencyRecord(
                tenant_id="default", key="k", fingerprint="f", job_id=job_id, created_ms=T0, expires_ms=T0 + 60_000
            )

        results: list[Any] = [None] * 8
        start = threading.Barrier(8)

        def submit(n: int) -> None:
            start.wait()
            results[n] = store.create_job(make_job(f"job_{n}"), [make_run(f"job_{n}")], record(f"job_{n}"))

        threads = [threading.Thread(target=submit, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        created = [r.job.job_id for r in results if r.created]
        assert len(created) == 1
        assert {r.job.job_id for r in results} == set(created)
        assert execute(store, "SELECT count(*) AS n FROM {jobs}") == [{"n": 1}]
        assert execute(store, "SELECT count(*) AS n FROM {runs}") == [{"n": 1}]

    def test_data_survives_closing_and_reopening_the_store(
        self, schema_url: Callable[..., str], open_store: Callable[..., PostgresStore]
    ) -> None:
        url = schema_url()
        first = open_store(url)
        first.create_job(make_job("job_1", payload={"big": 2**60, "s": "é"}), [make_run("job_1")])
        first.register_worker("w1", ["t.a"], ["default"], T0)
        first.close()
        second = open_store(url)
        assert second.get_jobs([key("job_1")])[key("job_1")].payload == {"big": 2**60, "s": "é"}
        assert set(second.get_runs([f"job_1:{T0}"])) == {f"job_1:{T0}"}
        assert second.known_tasks() == {"t.a"}
        assert second.migrate() == []


# -- migrations ----------------------------------------------------------------------------------


class TestMigrations:
    def test_a_fresh_schema_is_migrated_once_and_a_second_run_does_nothing(
        self, schema_url: Callable[..., str]
    ) -> None:
        db = PostgresDatabase.from_url(schema_url(migrate="never"))
        try:
            assert db.schema_version() is None
            assert db.migrate() == ALL_VERSIONS
            assert db.migrate() == []
            assert db.schema_version() == LATEST
            assert [r["version"] for r in db.read("SELECT version FROM {versions} ORDER BY version")] == ALL_VERSIONS
        finally:
            db.close()

    def test_two_processes_migrating_at_once_apply_each_migration_once(self, schema_url: Callable[..., str]) -> None:
        url = schema_url(migrate="never")
        dbs = [PostgresDatabase.from_url(url) for _ in range(2)]
        applied: list[list[int]] = [[], []]
        start = threading.Barrier(2)

        def migrate(n: int) -> None:
            start.wait()
            applied[n] = dbs[n].migrate()

        threads = [threading.Thread(target=migrate, args=(n,)) for n in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        try:
            assert sorted(applied[0] + applied[1]) == ALL_VERSIONS
            assert dbs[0].read("SELECT count(*) AS n FROM {versions}") == [{"n": len(ALL_VERSIONS)}]
        finally:
            for db in dbs:
                db.close()

    def test_construction_creates_a_missing_schema_but_never_upgrades_an_outdated_one(
        self, schema_url: Callable[..., str], open_store: Callable[..., PostgresStore]
    ) -> None:
        url = schema_url()
        store = open_store(url)
        execute(store, "DELETE FROM {versions} WHERE version >= 2")
        execute(store, "DROP TABLE {events}, {tokens}, {tenants}")
        with pytest.raises(ConfigError, match=rf"at version 1, this jobq needs version {LATEST}: run `jobq init`"):
            PostgresStore.from_url(url)
        upgrader = PostgresStore.from_url(url, check_schema=False)  # what `jobq init` does
        try:
            assert upgrader.migrate() == ALL_VERSIONS[1:]
        finally:
            upgrader.close()
        open_store(url)  # up to date again

    def test_migrate_never_refuses_a_missing_schema(self, schema_url: Callable[..., str]) -> None:
        with pytest.raises(ConfigError, match=r"is absent.*run `jobq init`"):
            PostgresStore.from_url(schema_url(migrate="never"))

    def test_an_applied_migration_that_changed_is_refused(self, store: PostgresStore) -> None:
        execute(store, "UPDATE {versions} SET checksum = 'edited' WHERE version = 1")
        with pytest.raises(ConfigError, match=r"0001_store\.sql.*changed after it was applied"):
            store.migrate()


# -- the time index view and history ---------------------------------------------------------------


class TestTimeIndex:
    def test_claim_due_lists_due_ids_critical_first_without_claiming_them(self, store: PostgresStore) -> None:
        index = PostgresTimeIndex(store)
        store.add_runs(
            [
                make_run("job_low", T0, due_ms=T0 - 50, priority=Priority.LOW),
                make_run("job_crit", T0, priority=Priority.CRITICAL),
                make_run("job_def", T0, due_ms=T0 - 10),
                make_run("job_future", T0, due_ms=T0 + 1, priority=Priority.CRITICAL),
                make_run("job_running", T0, due_ms=T0 - 99, state=S.RUNNING),
            ]
        )
        assert index.claim_due(T0, 10) == [f"job_crit:{T0}", f"job_def:{T0}", f"job_low:{T0}"]
        assert index.claim_due(T0, 2) == [f"job_crit:{T0}", f"job_def:{T0}"]
        assert {r.state for r in store.get_runs(index.claim_due(T0, 10)).values()} == {S.SCHEDULED}

    def test_next_due_ms_is_the_earliest_scheduled_run_of_any_tier(self, store: PostgresStore) -> None:
        index = PostgresTimeIndex(store)
        assert index.next_due_ms() is None
        store.add_runs(
            [
                make_run("job_crit", T0, due_ms=T0 + 100, priority=Priority.CRITICAL),
                make_run("job_low", T0, due_ms=T0 + 7, priority=Priority.LOW),
                make_run("job_done", T0, due_ms=T0, state=S.SUCCEEDED),
            ]
        )
        assert index.next_due_ms() == T0 + 7

    def test_add_and_discard_change_nothing_because_the_store_is_the_index(self, store: PostgresStore) -> None:
        index = PostgresTimeIndex(store)
        store.add_runs([make_run("job_1")])
        index.discard([f"job_1:{T0}"])
        index.add([IndexEntry("job_ghost:1", T0, Priority.CRITICAL)])
        assert index.claim_due(T0, 10) == [f"job_1:{T0}"]
        assert index.derived_from_store
        assert isinstance(index, ClaimingIndex)
        [run] = index.claim_runs(T0, 10, "scanner", 1_000)
        assert (run.run_id, run.state, run.fence) == (f"job_1:{T0}", S.CLAIMED, 1)


def event(job_id: str, kind: str, at_ms: int) -> RunEvent:
    return RunEvent(run_id=f"{job_id}:{T0}", job_id=job_id, attempt=1, fence=1, kind=kind, at_ms=at_ms, worker="w1")


class TestHistory:
    def test_events_are_read_back_per_job_in_the_order_recorded(self, store: PostgresStore) -> None:
        history = PostgresHistory(store.db)
        mine = [
            event("job_1", "DISPATCHED", T0 + 2),
            event("job_1", "STARTED", T0 + 1),
            event("job_1", "SUCCEEDED", T0),
        ]
        history.record([mine[0], event("job_2", "STARTED", T0), *mine[1:]])
        history.record([])
        assert history.read(key("job_1")) == mine
        assert history.read(key("job_1"), limit=2) == mine[:2]
        assert history.read(key("job_3")) == []
        history.close()
        assert store.get_jobs([key("job_1")]) == {}  # the shared pool is still open: the sink did not own it

    def test_a_failed_write_is_logged_and_counted_never_raised(
        self, schema_url: Callable[..., str], caplog: pytest.LogCaptureFixture
    ) -> None:
        history = PostgresHistory.from_url(schema_url())
        history.close()
        before = METRICS.history_errors.value()
        history.record([event("job_1", "STARTED", T0)])
        assert METRICS.history_errors.value() == before + 1
        assert "history write failed" in caplog.text
        with pytest.raises(StoreUnavailable, match="closed"):
            history.read(key("job_1"))


# -- configuration and errors ----------------------------------------------------------------------


class TestErrors:
    def test_an_unreachable_server_is_store_unavailable_with_the_reason_and_no_password(self) -> None:
        port = free_port()
        with pytest.raises(StoreUnavailable) as caught:
            PostgresStore.from_url(f"postgresql://jobq:s3cret@127.0.0.1:{port}/test?connect_timeout=2")
        error = caught.value
        assert f"127.0.0.1:{port}" in str(error) and "Connection refused" in str(error)
        assert "s3cret" not in str(error) and "***" in str(error)
        assert error.retryable
        assert error.__cause__ is None and error.__suppress_context__  # no psycopg traceback attached
        assert not isinstance(error, psycopg.Error)

    @pytest.mark.parametrize(
        ("query", "key"),
        [
            ("pool_max=0", "pool_max"),
            ("pool_min=5&pool_max=2", "pool_max"),
            ("pool_timeout=soon", "pool_timeout"),
            ("schema=Bad-Name", "schema"),
            ("migrate=sometimes", "migrate"),
        ],
    )
    def test_a_bad_jobq_parameter_is_a_config_error_naming_it(self, dsn: str, query: str, key: str) -> None:
        with pytest.raises(ConfigError) as caught:
            PostgresStore.from_url(f"{dsn}?{query}")
        assert caught.value.key == key

    def test_an_unknown_libpq_parameter_is_a_config_error(self, dsn: str) -> None:
        with pytest.raises(ConfigError, match="bogus"):
            PostgresStore.from_url(f"{dsn}?bogus=1")

    def test_libpq_parameters_reach_the_server_verbatim(self, schema_url: Callable[..., str], open_store: Any) -> None:
        store = open_store(schema_url(options="-c lock_timeout=1234", application_name="jobq-test+1"))
        assert store.db.read("SHOW lock_timeout") == [{"lock_timeout": "1234ms"}]
        assert store.db.read("SHOW application_name") == [{"application_name": "jobq-test+1"}]

    def test_the_password_is_hidden_wherever_it_is_given(self) -> None:
        config = PostgresConfig.from_url("postgres://u:pw@db:5432/x?password=pw2&schema=s&pool_max=3")
        assert "pw" not in config.display.replace("password", "")
        assert (config.schema, config.pool_max) == ("s", 3)
        assert "schema" not in config.conninfo and "connect_timeout=10" in config.conninfo

    def test_connections_the_server_killed_are_replaced_without_failing_the_call(
        self, dsn: str, schema_url: Callable[..., str], open_store: Callable[..., PostgresStore]
    ) -> None:
        name = f"jobq-test-{uuid.uuid4().hex[:8]}"
        store = open_store(schema_url(application_name=name, pool_min=3, pool_max=3))
        store.add_runs([make_run("job_1", state=S.RUNNING, fence=1)])
        heartbeat = Transition(f"job_1:{T0}", frozenset({S.RUNNING}), S.RUNNING, 1, {"lease_expires_ms": T0})

        def restart() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                rows = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", [name]
                ).fetchall()
            assert rows  # the store's pooled connections were there, and are gone

        restart()
        assert set(store.get_runs([f"job_1:{T0}"])) == {f"job_1:{T0}"}
        restart()
        assert store.transition([heartbeat])[0] is not None

    def test_a_closed_store_is_unavailable(self, schema_url: Callable[..., str]) -> None:
        store = PostgresStore.from_url(schema_url())
        store.close()
        with pytest.raises(StoreUnavailable, match="closed"):
            store.get_jobs([key("job_1")])

    def test_a_schema_dropped_under_a_live_store_asks_for_jobq_init(self, dsn: str, store: PostgresStore) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{store.db.schema}" CASCADE')
        with pytest.raises(StoreError, match="run `jobq init`") as caught:
            store.add_runs([make_run("job_1")])
        assert not caught.value.retryable

    def test_a_duplicate_job_is_duplicate_job_and_bad_text_is_a_store_error(self, store: PostgresStore) -> None:
        store.create_job(make_job("job_1"), [])
        with pytest.raises(DuplicateJob):
            store.create_job(make_job("job_1"), [])
        with pytest.raises(StoreError) as caught:
            store.create_job(make_job("job_2", name="nul\x00byte"), [])
        assert isinstance(caught.value, JobqError) and not isinstance(caught.value, psycopg.Error)
        assert store.get_jobs([key("job_2")]) == {}


# -- the whole lifecycle on PostgreSQL -------------------------------------------------------------


@pytest.fixture
def h(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, clock: ManualClock, open_store: Callable[..., PostgresStore]
) -> Iterator[Harness]:
    """The lifecycle harness on a PostgreSQL store, time index (the fused claim) and history."""
    import harness

    store = open_store()
    settings = Settings.load({"store": "memory://", "history_flush_s": 0}, env={})

    def deployment(kind: str, tmp_path: Path, clock: ManualClock, **overrides: Any) -> Deployment:
        transport = MemoryTransport(visibility_timeout_s=settings.visibility_timeout_s, clock=clock)
        return Deployment(settings, store, PostgresTimeIndex(store), transport, PostgresHistory(store.db), clock)

    monkeypatch.setattr(harness, "make_deployment", deployment)
    h = Harness("postgres", tmp_path, clock)
    yield h
    h.close()


from test_lifecycle import (  # noqa: E402, F401  (collected here, with the PostgreSQL `h` above)
    test_a_critical_run_enqueued_after_1000_low_runs_starts_next,
    test_a_cron_job_fires_at_each_time_and_beat_is_idempotent,
    test_a_delayed_job_waits_for_its_time,
    test_a_task_failing_twice_then_succeeding_ends_at_attempt_3_with_jittered_delays,
    test_a_task_that_always_fails_is_dead_lettered_and_redrive_runs_it_again,
    test_an_expired_dispatch_lease_is_dispatched_again_without_counting_an_attempt,
    test_an_instant_job_runs_once_and_completes_its_job,
    test_fail_stops_retries_and_retry_chooses_its_delay,
    test_non_retryable_errors_fail_at_once,
    test_the_reaper_reclaims_an_expired_running_lease_and_the_late_completion_is_rejected,
    test_the_scanner_dispatches_critical_runs_before_lower_tiers,
)


def test_jobq_init_upgrades_an_outdated_schema_that_the_store_refuses(schema_url: Callable[..., str]) -> None:
    from click.testing import CliRunner

    from jobq.cli.main import cli

    url = schema_url()
    store = PostgresStore.from_url(url)
    execute(store, "DELETE FROM {versions} WHERE version >= 2")
    execute(store, "DROP TABLE {events}, {tokens}, {tenants}")
    store.close()
    with pytest.raises(ConfigError, match="run `jobq init`"):
        PostgresStore.from_url(url)
    result = CliRunner().invoke(cli, ["init", "--store", url])
    assert result.exit_code == 0, result.output
    assert f"at version {LATEST}: applied migrations {ALL_VERSIONS[1:]}" in result.output
    again = CliRunner().invoke(cli, ["init", "--store", url])
    assert "already up to date" in again.output
    PostgresStore.from_url(url).close()


def test_a_schema_missing_a_migration_below_its_newest_is_refused_until_init_applies_it(
    schema_url: Callable[..., str], open_store: Callable[..., PostgresStore]
) -> None:
    """Migration numbers are handed out ahead of merging, so a file may arrive after a later one
    ran: the schema is then at the newest version yet lacks one, and construction says so."""
    url = schema_url()
    store = open_store(url)
    execute(store, "DELETE FROM {versions} WHERE version = 2")
    execute(store, "DROP TABLE {events}")
    with pytest.raises(ConfigError, match=r"lacks migrations \[2\]: run `jobq init`"):
        PostgresStore.from_url(url)
    upgrader = PostgresStore.from_url(url, check_schema=False)
    try:
        assert upgrader.migrate() == [2]
    finally:
        upgrader.close()
    open_store(url)


def test_migration_4_keys_jobs_by_tenant_and_keeps_the_data_of_schema_3(schema_url: Callable[..., str]) -> None:
    """A schema of the previous version (migrations 1-3, jobs keyed by job id alone) with its data:
    `jobq init` keys jobs by (tenant, job id), and the jobs and runs written before stay readable."""
    url = schema_url()
    old = PostgresStore.from_url(f"{url}&migrate=never", check_schema=False)
    try:
        for migration in migrations()[:3]:
            old.db.run(lambda conn, m=migration: old.db._apply(conn, m))
        for tenant, job_id in (("default", "nightly"), ("acme", "report")):
            job = make_job(job_id, tenant_id=tenant)
            row = [job.job_id, tenant, job.name, "ACTIVE", 2, T0, 0, job.model_dump_json()]
            execute(old, "INSERT INTO {jobs} VALUES (%s, %s, %s, %s, %s, %s, %s, %s::jsonb)", row)
            # The previous version named runs job_id:ms whatever the tenant; those ids stay valid.
            run = [f"{job_id}:{T0}", job_id, tenant, T0, T0, 2, "SCHEDULED", 1, 0, 0]
            columns = "run_id, job_id, tenant_id, nominal_ms, due_ms, priority, state, attempt, fence, version"
            values = ", ".join(["%s"] * len(run))
            execute(old, f"INSERT INTO {{runs}} ({columns}, created_ms, updated_ms) VALUES ({values}, 0, 0)", run)
        with pytest.raises(ConfigError, match="run `jobq init`"):
            PostgresStore.from_url(url)
        assert old.migrate() == [m.version for m in migrations()[3:]]
    finally:
        old.close()
    store = PostgresStore.from_url(url)
    try:
        jobs = store.get_jobs([key("nightly"), key("report", "acme"), key("report")])
        assert set(jobs) == {key("nightly"), key("report", "acme")}
        assert [r.run_id for r in store.list_runs(RunQuery(job=key("report", "acme"))).items] == [f"report:{T0}"]
        assert store.run_counts(key("report", "acme")) == {S.SCHEDULED: 1}
        assert store.create_job(make_job("report"), [make_run("report", T0 + 1)]).created  # now free in `default`
        with pytest.raises(DuplicateJob):
            store.create_job(make_job("report", tenant_id="acme"), [])
        assert store.set_job_status(key("nightly"), JobStatus.QUARANTINED, frozenset({JobStatus.ACTIVE}), T0)
    finally:
        store.close()
