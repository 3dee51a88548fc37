"""The DaemonRegistry and RunCensus contracts, on every store backend against its real server."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from factories import T0, make_job, make_run

from jobq.models import Priority, RunState
from jobq.ports import DaemonRegistry, JobStore, RunCensus
from jobq.registry import DaemonRecord, Role, Running
from jobq.sqlitedb import SqliteDatabase
from jobq.store.dynamodb_items import shard_of
from jobq.store.sqlite import SqliteStore

from .test_store import store  # noqa: F401 - the parametrised fixture over every backend

TTL = 15_000


def _record(daemon_id: str = "worker-a", role: Role = Role.WORKER, seen: int = T0, **more: object) -> DaemonRecord:
    fields: dict[str, object] = {
        "daemon_id": daemon_id,
        "role": role,
        "host": "host-1",
        "pid": 4242,
        "version": "0.1.0",
        "started_ms": T0 - 1000,
        "seen_ms": seen,
    }
    fields.update(more)
    return DaemonRecord(**fields)  # type: ignore[arg-type]


def test_every_store_is_a_registry_and_counts_runs(store: JobStore) -> None:  # noqa: F811
    assert isinstance(store, DaemonRegistry) and isinstance(store, RunCensus)


def test_a_heartbeat_keeps_a_daemon_live_until_its_ttl_ends(store: DaemonRegistry) -> None:  # noqa: F811
    store.heartbeat([_record()], TTL)
    assert [r.daemon_id for r in store.live_daemons(T0 + TTL - 1)] == ["worker-a"]
    assert store.live_daemons(T0 + TTL) == []


def test_a_record_comes_back_with_every_field(store: DaemonRegistry) -> None:  # noqa: F811
    running = (Running("default/job_1:1790000000000", "billing.aggregate", 2, T0 - 50),)
    record = _record(
        queues=("critical", "high"),
        pool="threads",
        concurrency=8,
        done=120,
        failures=3,
        busy=1,
        free=6,
        lost=1,
        last_error="ValueError: bad [input]",
        last_error_ms=T0 - 10,
        running=running,
        start_lateness={"HIGH": (1.0, 2.0, 2.0, 0.125)},
    )
    store.heartbeat([record], TTL)
    assert store.live_daemons(T0) == [replace(record, expires_ms=T0 + TTL)]


def test_a_later_heartbeat_replaces_the_entry(store: DaemonRegistry) -> None:  # noqa: F811
    store.heartbeat([_record(done=1)], TTL)
    store.heartbeat([_record(seen=T0 + 5000, done=7)], TTL)
    (entry,) = store.live_daemons(T0 + TTL + 1)
    assert (entry.done, entry.seen_ms, entry.expires_ms) == (7, T0 + 5000, T0 + 5000 + TTL)


def test_live_daemons_are_listed_by_role_then_id(store: DaemonRegistry) -> None:  # noqa: F811
    store.heartbeat(
        [_record("w2"), _record("s1", Role.SCANNER), _record("w1"), _record("b1", Role.BEAT), _record("a1", Role.API)],
        TTL,
    )
    assert [(r.role, r.daemon_id) for r in store.live_daemons(T0)] == [
        (Role.API, "a1"),
        (Role.BEAT, "b1"),
        (Role.SCANNER, "s1"),
        (Role.WORKER, "w1"),
        (Role.WORKER, "w2"),
    ]


def test_deregistering_removes_only_the_named_entries(store: DaemonRegistry) -> None:  # noqa: F811
    store.heartbeat([_record("w1"), _record("w2")], TTL)
    store.deregister(["w1", "never-registered"])
    assert [r.daemon_id for r in store.live_daemons(T0)] == ["w2"]
    store.deregister([])


def test_the_census_counts_runs_waiting_for_dispatch_and_start(store: JobStore) -> None:  # noqa: F811
    if hasattr(store, "census_shards"):
        store.census_shards = 16  # type: ignore[attr-defined] # every shard: the sample is the whole
    now = T0 + 60_000
    lease = {"lease_owner": "w", "lease_expires_ms": now + 30_000}
    runs = [
        make_run("job_1", T0, state=RunState.SCHEDULED, priority=Priority.CRITICAL),
        make_run("job_1", T0 + 1000, state=RunState.SCHEDULED, priority=Priority.CRITICAL),
        make_run("job_1", now + 5000, state=RunState.SCHEDULED, priority=Priority.CRITICAL),  # not due yet
        make_run("job_2", T0 + 2000, state=RunState.CLAIMED, priority=Priority.LOW, fence=1, **lease),
        make_run(
            "job_2", T0 + 3000, state=RunState.DISPATCHED, priority=Priority.LOW, dispatched_ms=T0 + 4000, **lease
        ),
        make_run(
            "job_2", T0 + 5000, state=RunState.DISPATCHED, priority=Priority.LOW, dispatched_ms=T0 + 9000, **lease
        ),
        make_run("job_3", T0, state=RunState.RUNNING, started_ms=T0 + 10, **lease),
        make_run("job_3", T0 + 1, state=RunState.FAILED, dead_letter=True, last_error="boom"),
    ]
    for job_id in ("job_1", "job_2", "job_3"):
        store.create_job(make_job(job_id), [])
    store.add_runs(runs)

    census = store.census(now)  # type: ignore[attr-defined]
    assert census.at_ms == now
    for state, n in {"SCHEDULED": 3, "CLAIMED": 1, "DISPATCHED": 2, "RUNNING": 1, "FAILED": 1}.items():
        assert census.states.get(RunState(state)) == n, state
    assert census.dead_letters == 1
    critical, low = census.tiers[Priority.CRITICAL], census.tiers[Priority.LOW]
    assert (critical.due, critical.oldest_due_ms, critical.dispatched) == (2, T0, 0)
    assert (low.due, low.oldest_due_ms) == (1, T0 + 2000)
    assert (low.dispatched, low.oldest_dispatched_ms) == (2, T0 + 4000)
    assert census.tiers[Priority.HIGH].due == 0 and census.tiers[Priority.HIGH].oldest_due_ms is None


def test_the_census_of_an_empty_store_is_zero(store: JobStore) -> None:  # noqa: F811
    census = store.census(T0)  # type: ignore[attr-defined]
    assert census.states == {} and census.dead_letters == 0
    assert all(t.due == 0 and t.dispatched == 0 for t in census.tiers.values())


def _finished_runs(backend: JobStore, succeeded: int, cancelled: int) -> None:
    backend.create_job(make_job("job_done"), [])
    runs = [make_run("job_done", T0 + i, state=RunState.SUCCEEDED) for i in range(succeeded)]
    runs += [make_run("job_done", T0 + succeeded + i, state=RunState.CANCELLED) for i in range(cancelled)]
    backend.add_runs(runs)


def test_postgres_estimates_finished_runs_from_its_statistics_once_analysed(tmp_path: Path) -> None:
    from .test_store import _postgres

    db_store = _postgres(tmp_path)
    try:
        _finished_runs(db_store, 200, 100)
        db_store.add_runs([make_run("job_done", T0 - 5, state=RunState.SCHEDULED)])
        before = db_store.census(T0)  # type: ignore[attr-defined]
        assert before.exact and before.states[RunState.SUCCEEDED] == 200
        db_store.db.run(lambda conn: conn.execute(db_store.db.sql("ANALYZE {runs}")))  # type: ignore[attr-defined]
        after = db_store.census(T0)  # type: ignore[attr-defined]
        assert not after.exact
        assert after.states[RunState.SUCCEEDED] == 200 and after.states[RunState.CANCELLED] == 100
        assert after.states[RunState.SCHEDULED] == 1, "waiting runs are always counted exactly"
    finally:
        db_store.close()


def test_sqlite_counts_finished_runs_at_most_once_a_minute(tmp_path: Path) -> None:
    db_store = SqliteStore(SqliteDatabase(tmp_path / "db_store.db"))
    try:
        _finished_runs(db_store, 3, 0)
        assert db_store.census(T0).states[RunState.SUCCEEDED] == 3
        db_store.add_runs([make_run("job_done", T0 + 100, state=RunState.SUCCEEDED)])
        db_store.add_runs([make_run("job_done", T0 + 101, state=RunState.SCHEDULED)])
        soon = db_store.census(T0 + 59_000)
        assert soon.states[RunState.SUCCEEDED] == 3 and soon.states[RunState.SCHEDULED] == 1
        assert db_store.census(T0 + 60_000).states[RunState.SUCCEEDED] == 4
    finally:
        db_store.close()


def test_dynamodb_samples_shards_and_scales_the_counts(tmp_path: Path) -> None:
    from .test_store import _dynamodb

    db_store = _dynamodb(tmp_path)
    try:
        db_store.create_job(make_job("job_1"), [])
        runs = [make_run("job_1", T0 + i, state=RunState.SCHEDULED) for i in range(64)]
        db_store.add_runs(runs)
        db_store.census_shards = 16  # type: ignore[attr-defined]
        assert db_store.census(T0 + 1000).states[RunState.SCHEDULED] == 64  # type: ignore[attr-defined]
        db_store.census_shards = 4  # type: ignore[attr-defined]
        sampled = db_store.census(T0 + 1000)  # type: ignore[attr-defined]
        in_sample = sum(1 for r in runs if shard_of(r.run_id) < 4)
        assert not sampled.exact and sampled.states.get(RunState.SCHEDULED, 0) == in_sample * 4
        assert RunState.SUCCEEDED not in sampled.states, "finished runs are in no index: not counted"
    finally:
        db_store.close()
