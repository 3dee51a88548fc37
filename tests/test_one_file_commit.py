"""On the embedded default the store, time index and queue are one SQLite file, so a submission's
job, runs and messages commit in one transaction (`SqliteDatabase.atomic`, `Deployment.atomic`):
a job is never stored without its messages, and a submission costs one commit, not two."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from jobq.app import App, JobHandle
from jobq.errors import StoreError
from jobq.models import JobKey, RunState
from jobq.ports import RunQuery
from jobq.settings import Settings
from jobq.sqlitedb import SqliteDatabase
from jobq.transport.sqlite import SqliteTransport
from jobq.wiring import connect

TASK = "tests.onefile.noop"


@pytest.fixture
def db(tmp_path: Path) -> Iterator[SqliteDatabase]:
    database = SqliteDatabase(tmp_path / "x.db")
    with database.write() as conn:
        conn.execute("CREATE TABLE t (v TEXT PRIMARY KEY)")
    yield database
    database.close()


def values(db: SqliteDatabase) -> list[str]:
    return [row["v"] for row in db.read("SELECT v FROM t ORDER BY v")]


def test_writes_inside_atomic_commit_together_and_one_that_raises_undoes_only_its_own(db: SqliteDatabase) -> None:
    with db.atomic():
        with db.write() as conn:
            conn.execute("INSERT INTO t VALUES ('a')")
        with pytest.raises(StoreError), db.write() as conn:  # a constraint: translated as a transaction's
            conn.execute("INSERT INTO t VALUES ('b')")
            conn.execute("INSERT INTO t VALUES ('a')")
        with db.write() as conn:
            conn.execute("INSERT INTO t VALUES ('c')")
        assert SqliteDatabase(db.path).read("SELECT count(*) AS n FROM t")[0]["n"] == 0  # not yet committed
    assert values(db) == ["a", "c"]


def test_an_error_inside_atomic_rolls_every_joined_write_back(db: SqliteDatabase) -> None:
    with pytest.raises(RuntimeError, match="later"), db.atomic():
        with db.write() as conn:
            conn.execute("INSERT INTO t VALUES ('a')")
        raise RuntimeError("something later failed")
    assert values(db) == []
    with db.write() as conn:  # the thread is out of the atomic scope: a plain transaction again
        conn.execute("INSERT INTO t VALUES ('z')")
    assert values(db) == ["z"]


def test_an_atomic_inside_another_joins_it_and_leaves_it_joinable(db: SqliteDatabase) -> None:
    with pytest.raises(RuntimeError, match="outer"), db.atomic():
        with db.atomic(), db.write() as conn:
            conn.execute("INSERT INTO t VALUES ('inner')")
        with db.write() as conn:  # still inside the outer one: joins it rather than being refused
            conn.execute("INSERT INTO t VALUES ('after')")
        raise RuntimeError("the outer one fails")
    assert values(db) == []  # the inner one's write went with the outer transaction


def test_a_nested_write_outside_atomic_is_still_refused_as_a_bug(db: SqliteDatabase) -> None:
    with pytest.raises(RuntimeError, match="nested write"), db.write(), db.write():
        pass


class Traced:
    """A deployment on one SQLite file whose every connection records the statements it runs."""

    def __init__(self, tmp_path: Path, grouped: bool, monkeypatch: pytest.MonkeyPatch) -> None:
        self.statements: list[str] = []
        original = SqliteDatabase._connect

        def traced(db: SqliteDatabase) -> sqlite3.Connection:
            conn = original(db)
            conn.set_trace_callback(self.statements.append)
            return conn

        monkeypatch.setattr(SqliteDatabase, "_connect", traced)
        urls = {
            "store": f"sqlite:///{tmp_path / 'jobq.db'}",
            "history_flush_s": 0,
            "group_commit": str(grouped).lower(),
        }
        self.app = App("onefile", settings=Settings.load(urls, env={}))
        self.noop = self.app.task(name=TASK)(lambda x: None)
        self.d = self.app.deployment

    def commits_of(self, call: Callable[[], object]) -> int:
        self.statements.clear()
        call()
        return sum(1 for s in self.statements if s.startswith("BEGIN IMMEDIATE"))


@pytest.fixture(params=[True, False], ids=["group-commit", "alone"])
def traced(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Traced]:
    t = Traced(tmp_path, request.param, monkeypatch)
    yield t
    t.d.close()


def test_an_instant_job_its_run_and_its_message_are_one_commit(traced: Traced) -> None:
    assert traced.d.atomic is not None
    handles: list[JobHandle] = []
    assert traced.commits_of(lambda: handles.append(traced.noop.delay(1))) == 1
    assert traced.d.store.get_jobs([JobKey("default", handles[0].job_id)])
    assert traced.d.transport.depth("default") == 1
    [run] = traced.d.store.list_runs(RunQuery(job=JobKey("default", handles[0].job_id))).items
    assert run.state is RunState.DISPATCHED


def test_a_publish_that_fails_after_writing_leaves_no_job_no_run_and_no_message(
    traced: Traced, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish = SqliteTransport.publish

    def breaks_after_writing(self: SqliteTransport, queue: str, bodies: Sequence[bytes]) -> None:
        publish(self, queue, bodies)
        raise OSError("the process ran out of something just after enqueueing")

    monkeypatch.setattr(SqliteTransport, "publish", breaks_after_writing)
    with pytest.raises(OSError, match="ran out"):
        traced.noop.schedule(args=(1,), job_id="never-half-written")
    assert traced.d.store.get_jobs([JobKey("default", "never-half-written")]) == {}
    assert traced.d.store.list_runs(RunQuery(job=JobKey("default", "never-half-written"))).items == []
    assert traced.d.transport.depth("default") == 0


def test_a_deployment_whose_queue_is_elsewhere_has_no_one_file_transaction(tmp_path: Path) -> None:
    urls = {"store": f"sqlite:///{tmp_path / 'a.db'}", "broker": f"sqlite:///{tmp_path / 'b.db'}"}
    d = connect(Settings.load(urls, env={}))
    try:
        assert d.atomic is None
    finally:
        d.close()
