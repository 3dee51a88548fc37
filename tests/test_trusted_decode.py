"""Specs for the hot path's trusted decoding (issue 14): runs read back from the SQL stores and the
history events built from them skip pydantic's validation when every value has exactly its type,
and decode exactly as validation would; anything else is validated, so a corrupt row is still a
corrupt marker. And the SQLite write lock: a writer waits for another's transaction, within a bound."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from factories import make_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from jobq import sqlitedb
from jobq.daemons.base import event
from jobq.errors import StoreUnavailable
from jobq.models import _OPTIONAL_RUN_TYPES, _RUN_TYPES, RUN_FIELDS, Priority, Run, RunEvent, RunState
from jobq.sqlitedb import SqliteDatabase
from jobq.store.sqlite import RUN_COLUMNS, SqliteStore, _run_values

_ms = st.integers(min_value=0, max_value=2**53)
_opt_ms = st.none() | _ms
_text = st.text(max_size=20)
_opt_text = st.none() | _text
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)

# Every stored field of a run, each over its whole type.
runs = st.builds(
    Run,
    run_id=_text,
    job_id=_text,
    tenant_id=_text,
    nominal_ms=_ms,
    due_ms=_ms,
    priority=st.sampled_from(Priority),
    state=st.sampled_from(RunState),
    attempt=st.integers(1, 1000),
    fence=st.integers(0, 2**31),
    version=st.integers(0, 2**31),
    lease_owner=_opt_text,
    lease_expires_ms=_opt_ms,
    last_heartbeat_ms=_opt_ms,
    last_error=_opt_text,
    deadline_ms=_opt_ms,
    prev_run_id=_opt_text,
    blocked_by=_opt_text,
    dead_letter=st.booleans(),
    result=_json,
    created_ms=_ms,
    updated_ms=_ms,
    dispatched_ms=_opt_ms,
    started_ms=_opt_ms,
    finished_ms=_opt_ms,
    handbacks=st.integers(0, 100),
    trace=_opt_text,
    attempt_base=st.integers(0, 100),
)


def _stored(run: Run) -> dict[str, Any]:
    """The fields a SQL store hands `Run.from_store`: one per stored field, in column order."""
    fields = run.model_dump()  # `corrupt` is never dumped
    return {name: fields[name] for name in RUN_FIELDS}


def _same(a: Run, b: Run) -> None:
    assert a == b
    assert a.model_dump_json() == b.model_dump_json()
    assert a.model_fields_set == b.model_fields_set


def test_the_trusted_check_names_every_stored_field_of_a_run_once() -> None:
    checked = [name for _, names in (*_RUN_TYPES, *_OPTIONAL_RUN_TYPES) for name in names]
    assert len(checked) == len(set(checked))
    # priority, state and result are checked (or free) on their own; every other field is typed here.
    assert set(checked) == set(RUN_FIELDS) - {"priority", "state", "result"}


@settings(deadline=None)
@given(runs)
def test_a_run_from_the_store_decodes_exactly_as_validation_would(run: Run) -> None:
    _same(Run.from_store(_stored(run)), Run.model_validate(_stored(run)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(run=runs)
def test_every_run_field_survives_a_round_trip_through_sqlite(run: Run, tmp_path: Path) -> None:
    store = SqliteStore(SqliteDatabase(tmp_path / "jobq.db"))
    try:
        run = run.model_copy(update={"run_id": uuid.uuid4().hex})
        store.add_runs([run])
        back = store.get_runs([run.run_id])[run.run_id]
        assert back.corrupt is None
        _same(back, run)
    finally:
        store.close()


_garbage = st.sampled_from(["many", "3", 3.0, 2.5, True, None, b"x", [], {}, -1, "RUNNING", "BOGUS"])


@settings(deadline=None)
@given(runs, st.sampled_from([*RUN_FIELDS]), _garbage)
def test_a_run_with_any_value_out_of_type_decodes_or_fails_exactly_as_validation_would(
    run: Run, name: str, value: object
) -> None:
    fields = _stored(run)
    fields[name] = value
    try:
        expected: Run | None = Run.model_validate(dict(fields))
    except ValidationError as exc:
        with pytest.raises(ValidationError) as raised:
            Run.from_store(dict(fields))
        assert raised.value.errors() == exc.errors()
        return
    assert expected is not None
    _same(Run.from_store(dict(fields)), expected)


@pytest.mark.parametrize(
    ("column", "value"), [("attempt", "many"), ("state", "BOGUS"), ("fence", 2.5), ("priority", 9)]
)
def test_a_sqlite_row_that_does_not_decode_is_still_a_corrupt_marker(
    tmp_path: Path, column: str, value: object
) -> None:
    store = SqliteStore(SqliteDatabase(tmp_path / "jobq.db"))
    try:
        healthy, poison = make_run("healthy"), make_run("poison")
        store.add_runs([healthy])
        values = list(_run_values(poison))
        values[RUN_COLUMNS.index(column)] = value
        with store.db.write() as conn:
            conn.execute(
                f"INSERT INTO jobq_runs ({', '.join(RUN_COLUMNS)}) VALUES ({','.join('?' * len(values))})", values
            )
        found = store.get_runs([healthy.run_id, poison.run_id])
        assert found[healthy.run_id].corrupt is None
        assert found[poison.run_id].corrupt is not None and found[poison.run_id].corrupt.startswith(f"{column}:")
    finally:
        store.close()


def test_a_history_event_built_from_a_run_equals_the_validated_one() -> None:
    run = make_run(state=RunState.RUNNING, attempt=2, fence=7, last_error="boom")
    built = event(run, "RETRYING", 1234, worker="w-1", duration_ms=15)
    expected = RunEvent.model_validate(built.model_dump())
    assert built == expected and built.model_dump_json() == expected.model_dump_json()
    assert list(built.model_dump()) == list(RunEvent.model_fields)


def test_a_history_event_with_a_value_out_of_type_is_validated_and_refused() -> None:
    with pytest.raises(ValidationError):
        event(make_run(), "SUCCEEDED", 1234, duration_ms=1.5)


def test_a_sqlite_writer_waits_for_another_connections_transaction_and_then_commits(tmp_path: Path) -> None:
    db = SqliteDatabase(tmp_path / "lock.db")
    db.executescript("CREATE TABLE t (v INTEGER)")
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with db.write() as conn:
            conn.execute("INSERT INTO t VALUES (1)")
            holding.set()
            release.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(5)
    threading.Timer(0.3, release.set).start()
    started = time.monotonic()
    with db.write() as conn:  # another thread: its own connection
        conn.execute("INSERT INTO t VALUES (2)")
    waited = time.monotonic() - started
    holder.join()
    assert [r[0] for r in db.read("SELECT v FROM t ORDER BY v")] == [1, 2]
    assert waited >= 0.25  # it waited for the holder's commit rather than failing
    db.close()


def test_a_sqlite_writer_gives_up_after_the_lock_wait_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlitedb, "_LOCK_WAIT_S", 0.2)
    db = SqliteDatabase(tmp_path / "lock.db")
    db.executescript("CREATE TABLE t (v INTEGER)")
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with db.write():
            holding.set()
            release.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(5)
    try:
        with pytest.raises(StoreUnavailable, match="locked"), db.write():
            pass
        # The busy timeout is back for the connection's other statements.
        assert db.read("PRAGMA busy_timeout")[0][0] == sqlitedb._BUSY_TIMEOUT_MS
    finally:
        release.set()
        holder.join()
        db.close()
