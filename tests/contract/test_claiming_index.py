"""The optional fused claim of store-native indexes (SQLite, PostgreSQL): find and claim in one step."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from factories import T0, make_run

from jobq.models import Priority, RunState
from jobq.ports import ClaimingIndex, JobStore
from jobq.sqlitedb import SqliteDatabase
from jobq.store.sqlite import SqliteStore
from jobq.timeindex.sqlite import SqliteTimeIndex

from .test_store import STORES


def _sqlite(tmp_path: Path) -> tuple[JobStore, ClaimingIndex]:
    store = SqliteStore(SqliteDatabase(tmp_path / "idx.db"))
    return store, SqliteTimeIndex(store)


def _postgres(tmp_path: Path) -> tuple[JobStore, ClaimingIndex]:
    from jobq.store.postgres import PostgresStore
    from jobq.timeindex.postgres import PostgresTimeIndex

    store = STORES["postgres"](tmp_path)
    assert isinstance(store, PostgresStore)
    return store, PostgresTimeIndex(store)


INDEXES: dict[str, Callable[[Path], tuple[JobStore, ClaimingIndex]]] = {"sqlite": _sqlite, "postgres": _postgres}


@pytest.fixture(params=sorted(INDEXES))
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[JobStore, ClaimingIndex]]:
    store, index = INDEXES[request.param](tmp_path)
    yield store, index
    store.close()


def test_claim_runs_takes_due_runs_critical_first_and_bumps_fences(pair: tuple[JobStore, ClaimingIndex]) -> None:
    store, index = pair
    store.add_runs(
        [
            make_run("job_low", T0 - 100, priority=Priority.LOW),
            make_run("job_crit", T0, priority=Priority.CRITICAL),
            make_run("job_high", T0 - 50, priority=Priority.HIGH),
            make_run("job_later", T0 + 1, priority=Priority.CRITICAL),
        ]
    )
    first = index.claim_runs(T0, 2, "s1", 5000)
    assert [r.job_id for r in first] == ["job_crit", "job_high"]
    assert all(r.state is RunState.CLAIMED and r.fence == 1 and r.lease_owner == "s1" for r in first)
    assert [r.job_id for r in index.claim_runs(T0, 10, "s1", 5000)] == ["job_low"]
    assert index.claim_runs(T0, 10, "s1", 5000) == []


def test_claim_runs_looks_ahead_to_due_by_with_its_lease_from_now(pair: tuple[JobStore, ClaimingIndex]) -> None:
    store, index = pair
    store.add_runs([make_run("job_soon", T0 + 200), make_run("job_later", T0 + 400)])
    assert index.claim_runs(T0, 10, "s1", 5000) == []
    [run] = index.claim_runs(T0, 10, "s1", 5000, due_by_ms=T0 + 300)
    assert (run.job_id, run.state, run.lease_expires_ms, run.updated_ms) == (
        "job_soon",
        RunState.CLAIMED,
        T0 + 5000,
        T0,
    )


def test_concurrent_claimers_take_each_due_run_once(pair: tuple[JobStore, ClaimingIndex]) -> None:
    store, index = pair
    store.add_runs([make_run("job_1", T0 + i) for i in range(300)])
    got: list[list[str]] = [[] for _ in range(4)]

    def claimer(n: int) -> None:
        while batch := index.claim_runs(T0 + 1000, 25, f"s{n}", 5000):
            got[n] += [r.run_id for r in batch]

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [r for g in got for r in g]
    assert len(everything) == len(set(everything)) == 300
