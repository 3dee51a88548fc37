"""Beat at burst scale: CRITICAL jobs first, one write per batch, and several beats sharing the jobs.

Run on the embedded SQLite store and on a real PostgreSQL (a schema of the test's own; skipped
without a server, failing when CI=true), each driven by a manual clock.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from factories import make_job

from jobq.clock import ManualClock
from jobq.daemons.beat import Beat
from jobq.deployment import Deployment
from jobq.models import Job, Priority, Run, RunState, Schedule, ScheduleType
from jobq.ports import JobStore
from jobq.registry import DaemonRecord, Role
from jobq.settings import Settings
from jobq.wiring import connect, init_store

T0 = 1_790_000_000_000
HORIZON_MS = 60_000
BATCH = 500


@contextlib.contextmanager
def _deployment(kind: str, tmp_path: Path, clock: ManualClock) -> Iterator[Deployment]:
    if kind == "sqlite":
        urls = {"store": f"sqlite:///{tmp_path / 'jobq.db'}"}
        drop: Callable[[], None] = lambda: None  # noqa: E731
    elif kind == "dynamodb":
        from moto_server import ACCESS_KEY, REGION, SECRET_KEY, shared_moto_server

        server = shared_moto_server()
        store = (
            f"dynamodb://jobq-beat-{uuid.uuid4().hex[:10]}?region={REGION}&endpoint={server.endpoint_url}"
            f"&aws_access_key_id={ACCESS_KEY}&aws_secret_access_key={SECRET_KEY}"
        )
        urls = {"store": store, "index": "memory://", "broker": "memory://", "history": "memory://"}
        drop = lambda: None  # noqa: E731  (the table is deleted with the deployment below)
    else:
        from services import require_postgres

        dsn = require_postgres()
        schema = f"jobq_beat_{uuid.uuid4().hex[:10]}"
        urls = {"store": f"{dsn}?schema={schema}", "broker": "memory://"}  # beat never publishes

        def drop() -> None:
            import psycopg

            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    settings = Settings.load({**urls, "history_flush_s": 0}, env={})
    init_store(settings)
    d = connect(settings, clock)
    try:
        yield d
    finally:
        d.close()
        drop()


@pytest.fixture(params=["sqlite", "postgres"])
def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Deployment]:
    with _deployment(request.param, tmp_path, ManualClock(T0)) as d:
        yield d


@pytest.fixture(params=["sqlite", "postgres", "dynamodb"])
def any_deployment(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Deployment]:
    """Also DynamoDB on moto's server, for the tests small enough for it (moto is slow)."""
    with _deployment(request.param, tmp_path, ManualClock(T0)) as d:
        if request.param == "dynamodb":
            _serialise_writes(d.store)
        yield d
        if request.param == "dynamodb":
            d.store.delete_table()  # type: ignore[attr-defined]


def _serialise_writes(store: Any) -> None:
    """moto's server applies concurrent transactions without a lock (and answers 500); DynamoDB
    serialises them. As in the contract suite, writes go one at a time so the test checks jobq."""
    lock = threading.Lock()
    call = store.table.call
    writes = {"put_item", "update_item", "delete_item", "transact_write_items", "batch_write_item"}

    def serialised(operation: str, **kwargs: object) -> Any:
        if operation not in writes:
            return call(operation, **kwargs)
        with lock:
            return call(operation, **kwargs)

    store.table.call = serialised


def _one_offs(prefix: str, n: int, due_ms: int, priority: Priority) -> list[Job]:
    schedule = Schedule(type=ScheduleType.ONE_OFF, at_ms=due_ms)
    return [make_job(f"{prefix}_{i:05d}", schedule=schedule, next_fire_ms=due_ms, priority=priority) for i in range(n)]


def _submit(store: JobStore, jobs: Sequence[Job]) -> None:
    for start in range(0, len(jobs), 1000):
        assert all(store.create_jobs([(job, []) for job in jobs[start : start + 1000]]))


def _runs(store: JobStore, jobs: Sequence[Job]) -> dict[str, Run]:
    ids = [Run.make_id(job.key, job.next_fire_ms or 0) for job in jobs]
    return store.get_runs(ids)


def _live(d: Deployment, beats: Sequence[Beat], now_ms: int) -> None:
    """The registrar's heartbeat for `beats` (a TTL of three 5 s heartbeats, as `jobq beat` writes)."""
    records = [DaemonRecord(b.daemon_id, Role.BEAT, "host", 1, "test", started_ms=T0, seen_ms=now_ms) for b in beats]
    d.registry.heartbeat(records, ttl_ms=15_000)


def test_critical_jobs_are_materialised_before_a_low_backlog_larger_than_a_batch(deployment: Deployment) -> None:
    due_ms = T0 + 90_000  # beyond the horizon when submitted; the LOW jobs first, as in W2 priority
    low = _one_offs("low", 3 * BATCH, due_ms, Priority.LOW)
    critical = _one_offs("zcritical", 10, due_ms, Priority.CRITICAL)  # last by id and by submission
    _submit(deployment.store, low + critical)
    beat = Beat(deployment, batch=BATCH)
    now = T0 + 31_000  # all of them enter the horizon at once
    assert beat.run_once(now) == BATCH
    made = _runs(deployment.store, critical)
    assert len(made) == len(critical)
    assert {r.priority for r in made.values()} == {Priority.CRITICAL}
    assert len(_runs(deployment.store, low)) == BATCH - len(critical)
    while beat.run_once(now):
        pass
    assert len(_runs(deployment.store, low)) == len(low)


def test_a_beat_writes_a_whole_batch_of_advances_in_one_transaction(deployment: Deployment) -> None:
    jobs = _one_offs("job", BATCH, T0 + 10_000, Priority.DEFAULT)
    _submit(deployment.store, jobs)
    writes = _count_write_transactions(deployment.store)
    beat = Beat(deployment, batch=BATCH)
    assert beat.materialise(T0) == BATCH
    assert writes() == 1  # one transaction for 500 advances and their runs, not one per job
    advanced = deployment.store.get_jobs([j.key for j in jobs])
    assert {(j.next_fire_ms, j.version) for j in advanced.values()} == {(None, jobs[0].version + 1)}
    assert len(_runs(deployment.store, jobs)) == BATCH


def _count_write_transactions(store: Any) -> Callable[[], int]:
    """A counter of the store's write transactions (SQLite `write`, PostgreSQL `run`) from now on."""
    db = store.db
    name = "write" if hasattr(db, "write") else "run"
    original = getattr(db, name)
    count = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return original(*args, **kwargs)

    setattr(db, name, counted)
    return lambda: count[0]


def test_two_beats_split_the_jobs_and_one_takes_all_when_the_other_dies(any_deployment: Deployment) -> None:
    deployment = any_deployment
    store = deployment.store
    a, b = Beat(deployment), Beat(deployment)
    _live(deployment, [a, b], T0)
    first = _one_offs("first", 64, T0 + 5_000, Priority.DEFAULT)
    _submit(store, first)
    made_by_a, made_by_b = a.materialise(T0), b.materialise(T0)
    assert made_by_a > 0 and made_by_b > 0
    assert made_by_a + made_by_b == len(first)  # every job by exactly one of them
    assert a.shards is not None and b.shards is not None
    assert set(a.shards) | set(b.shards) == set(range(16)) and not set(a.shards) & set(b.shards)
    assert len(_runs(store, first)) == len(first)

    # b dies: it stops heartbeating, and its entry expires with its TTL; a's next view takes all.
    second = _one_offs("second", 64, T0 + 40_000, Priority.DEFAULT)
    _submit(store, second)
    now = T0 + 16_000
    _live(deployment, [a], now)
    assert a.materialise(now) == len(second)
    assert a.shards is None
    assert len(_runs(store, second)) == len(second)


def test_beats_whose_views_differ_create_each_run_once(any_deployment: Deployment) -> None:
    deployment = any_deployment
    store = deployment.store
    a, b = Beat(deployment), Beat(deployment)
    _live(deployment, [b], T0)  # a has not heartbeaten yet: b owns every shard, and so does a
    jobs = _one_offs("job", 40, T0 + 5_000, Priority.DEFAULT)
    _submit(store, jobs)
    made_by_b: list[int] = []

    class Interleaved:
        """a's store: b's whole pass runs between a's read of the due jobs and a's advance."""

        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        def advance_jobs(self, items: Sequence[tuple[Job, Sequence[Run]]]) -> list[bool]:
            made_by_b.append(b.materialise(T0))
            return store.advance_jobs(items)

    a.store = Interleaved()  # type: ignore[assignment]
    made_by_a = a.materialise(T0)
    assert made_by_b == [len(jobs)] and made_by_a == 0
    advanced = store.get_jobs([j.key for j in jobs])
    assert {j.version for j in advanced.values()} == {jobs[0].version + 1}  # each advanced once
    runs = _runs(store, jobs)
    assert len(runs) == len(jobs) and {r.state for r in runs.values()} == {RunState.SCHEDULED}
