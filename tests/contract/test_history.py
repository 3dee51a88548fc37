"""The HistorySink contract: every backend records run events and reads a job's back in order."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from factories import T0, key
from moto_server import shared_moto_server
from sqlite_template import fresh_sqlite

from jobq.clock import ManualClock
from jobq.history.buffered import BufferedHistory
from jobq.history.memory import MemoryHistory
from jobq.history.sqlite import SqliteHistory
from jobq.models import RunEvent
from jobq.ports import HistorySink
from jobq.sqlitedb import SqliteDatabase

from .test_store import STORES


def _postgres(tmp_path: Path) -> HistorySink:
    from jobq.history.postgres import PostgresHistory
    from jobq.store.postgres import PostgresStore

    store = STORES["postgres"](tmp_path)  # a schema of this test's own, dropped on close
    assert isinstance(store, PostgresStore)

    class Owned(PostgresHistory):
        def close(self) -> None:
            super().close()
            store.close()

    return Owned(store.db)


def _moto_bucket() -> tuple[Any, str, Callable[[], None]]:
    """An S3 client on moto's server, a new bucket of this test's own, and what empties and deletes it."""
    import boto3

    s3 = boto3.client("s3", **shared_moto_server().client_kwargs())
    bucket = f"jobq-history-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)

    def drop() -> None:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", []):
                s3.delete_object(Bucket=bucket, Key=item["Key"])
        s3.delete_bucket(Bucket=bucket)
        s3.close()

    return s3, bucket, drop


def _s3(tmp_path: Path) -> HistorySink:
    from jobq.history.s3 import S3History

    s3, bucket, drop = _moto_bucket()

    class Owned(S3History):
        def close(self) -> None:
            super().close()
            drop()

    # The events are timed at T0, months ago: a clock at T0 puts them inside read's look-back.
    return Owned(s3, bucket, "history", clock=ManualClock(T0), flush_s=60)


def _firehose(tmp_path: Path) -> HistorySink:
    """A delivery stream into a bucket on moto's server, which delivers each PutRecordBatch to S3
    at once (Firehose's default YYYY/MM/DD/HH/ layout): `read` goes through that bucket."""
    import boto3

    from jobq.history.firehose import FirehoseHistory
    from jobq.history.s3scanner import FIREHOSE, HOUR_MS, S3EventScanner

    s3, bucket, drop = _moto_bucket()
    firehose = boto3.client("firehose", **shared_moto_server().client_kwargs())
    stream = f"jobq-history-{uuid.uuid4().hex[:12]}"
    firehose.create_delivery_stream(
        DeliveryStreamName=stream,
        DeliveryStreamType="DirectPut",
        ExtendedS3DestinationConfiguration={
            "RoleARN": "arn:aws:iam::123456789012:role/firehose",
            "BucketARN": f"arn:aws:s3:::{bucket}",
            "Prefix": "history/",
        },
    )

    class Owned(FirehoseHistory):
        def close(self) -> None:
            super().close()
            with contextlib.closing(firehose):
                firehose.delete_delivery_stream(DeliveryStreamName=stream)
            drop()

    reader = S3EventScanner(
        s3, bucket, "history", layout=FIREHOSE, clock=ManualClock(T0), early_ms=HOUR_MS, late_ms=HOUR_MS
    )
    return Owned(firehose, stream, reader=reader, flush_s=60)


SINKS: dict[str, Callable[[Path], HistorySink]] = {
    "memory": lambda tmp: MemoryHistory(),
    "sqlite": lambda tmp: SqliteHistory(SqliteDatabase(fresh_sqlite(tmp / "history.db"))),
    "sqlite-buffered": lambda tmp: BufferedHistory(
        SqliteHistory(SqliteDatabase(fresh_sqlite(tmp / "history.db"))), interval_s=60
    ),
    "postgres": _postgres,
    "s3": _s3,
    "firehose": _firehose,
}


@pytest.fixture(params=sorted(SINKS))
def sink(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[HistorySink]:
    backend = SINKS[request.param](tmp_path)
    yield backend
    backend.close()


def _event(job: str, n: int, kind: str = "STARTED", tenant_id: str = "default", **more: object) -> RunEvent:
    run_id = f"{job}:{T0}" if tenant_id == "default" else f"{tenant_id}/{job}:{T0}"
    fields = {"run_id": run_id, "job_id": job, "tenant_id": tenant_id, "attempt": n, "fence": n, "kind": kind}
    return RunEvent.model_validate({**fields, "at_ms": T0 + n, **more})


def test_a_job_s_events_come_back_in_the_order_recorded(sink: HistorySink) -> None:
    sink.record([_event("job_1", 1), _event("job_2", 1), _event("job_1", 1, "FAILED", error="boom")])
    sink.record([_event("job_1", 2), _event("job_1", 2, "SUCCEEDED", worker="w1", duration_ms=12)])
    events = sink.read(key("job_1"))
    assert [(e.attempt, e.kind) for e in events] == [(1, "STARTED"), (1, "FAILED"), (2, "STARTED"), (2, "SUCCEEDED")]
    assert events[1].error == "boom"
    assert (events[3].worker, events[3].duration_ms) == ("w1", 12)


def test_read_is_limited_and_other_jobs_are_not_mixed_in(sink: HistorySink) -> None:
    sink.record([_event("job_1", n) for n in range(1, 6)] + [_event("job_2", 9)])
    assert [e.attempt for e in sink.read(key("job_1"), limit=3)] == [1, 2, 3]
    assert [e.attempt for e in sink.read(key("job_2"))] == [9]
    assert sink.read(key("job_none")) == []


def test_two_tenants_jobs_of_the_same_id_have_separate_histories(sink: HistorySink) -> None:
    sink.record([_event("job_1", 1, tenant_id="acme"), _event("job_1", 2), _event("job_1", 3, tenant_id="globex")])
    assert [e.attempt for e in sink.read(key("job_1", "acme"))] == [1]
    assert [e.attempt for e in sink.read(key("job_1"))] == [2]
    assert [(e.tenant_id, e.attempt) for e in sink.read(key("job_1", "globex"))] == [("globex", 3)]
    assert sink.read(key("job_1", "initech")) == []


def test_flush_makes_buffered_events_readable(sink: HistorySink) -> None:
    sink.record([_event("job_1", 1)])
    sink.flush()
    assert len(sink.read(key("job_1"))) == 1


def test_recording_nothing_is_a_no_op(sink: HistorySink) -> None:
    sink.record([])
    assert sink.read(key("job_1")) == []


def test_an_event_row_that_does_not_decode_is_skipped_and_the_others_are_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = SqliteHistory(SqliteDatabase(tmp_path / "history.db"))
    sink.record([_event("job_1", 1), _event("job_1", 2)])
    with sink.db.write() as conn:  # a row no version of jobq would write
        conn.execute("UPDATE jobq_run_events SET attempt = 'first' WHERE attempt = 1")
    assert [e.attempt for e in sink.read(key("job_1"))] == [2]
    assert "1 events that do not decode skipped" in caplog.text
    sink.close()
