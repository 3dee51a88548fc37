"""The S3 and Firehose history sinks against moto's real server: layout, flushing, failures, reads."""

from __future__ import annotations

import gzip
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from factories import T0, key
from moto_server import MotoServer, moto  # noqa: F401
from services import free_port

from jobq.aws import aws_client
from jobq.clock import ManualClock
from jobq.errors import ConfigError, MissingExtra, StoreError, StoreUnavailable
from jobq.history.buffered import Line
from jobq.history.firehose import MAX_BATCH_BYTES, MAX_RECORD_BYTES, FirehoseHistory, batches, pack
from jobq.history.s3 import S3History
from jobq.history.s3scanner import CLOCK_SKEW_MS, DAY_MS, FIREHOSE, HIVE, HOUR_MS, S3EventScanner, job_created_ms
from jobq.ids import new_job_id
from jobq.metrics import METRICS
from jobq.models import RunEvent

BUCKET = "jobq-history-test"
STREAM = "jobq-history-test"
HOUR = T0 - T0 % HOUR_MS  # the start of T0's UTC hour
KEY = re.compile(r"history/dt=(\d{4}-\d{2}-\d{2})/hour=(\d{2})/(\d{13})-[^/]+-(\d+)-[0-9a-f]{6}-\d{8}\.ndjson(\.gz)?")


def _ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso).replace(tzinfo=UTC).timestamp() * 1000)


def _event(at_ms: int, job: str = "job_1", n: int = 1, kind: str = "STARTED", **more: Any) -> RunEvent:
    fields = {"run_id": f"{job}:{T0}", "job_id": job, "attempt": n, "fence": n, "kind": kind, "at_ms": at_ms, **more}
    return RunEvent.model_validate(fields)


def _client_error(code: str, status: int, operation: str) -> Exception:
    from botocore.exceptions import ClientError

    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, operation
    )


def _objects(s3: Any, prefix: str = "history/") -> dict[str, bytes]:
    """Every object under `prefix`, key to content (gunzipped), in key order."""
    found = {}
    for item in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", []):
        data = s3.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()
        found[item["Key"]] = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    return found


def _lines(data: bytes) -> list[RunEvent]:
    return [RunEvent.model_validate_json(line) for line in data.splitlines()]


def _wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


class Spy:
    """A boto3 client wrapper: counts calls by operation and lets a test replace one."""

    def __init__(self, client: Any, **overrides: Callable[..., Any]) -> None:
        self.client = client
        self.overrides = overrides
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        target = self.overrides.get(name) or getattr(self.client, name)
        if not callable(target) or name in ("get_paginator", "close"):
            return target

        def call(**kwargs: Any) -> Any:
            self.calls.append((name, kwargs))
            return target(**kwargs)

        return call

    def count(self, name: str) -> int:
        return sum(1 for op, _ in self.calls if op == name)


@pytest.fixture
def s3(moto: MotoServer) -> Any:  # noqa: F811
    client = moto.client("s3")
    client.create_bucket(Bucket=BUCKET)
    return client


@pytest.fixture
def make_s3(s3: Any) -> Iterator[Callable[..., S3History]]:
    """Builds `S3History` sinks on the test bucket (prefix `history`), closed after the test."""
    sinks: list[S3History] = []

    def make(client: Any = None, **options: Any) -> S3History:
        options.setdefault("clock", ManualClock(T0))
        sink = S3History(s3 if client is None else client, BUCKET, "history", **options)
        sinks.append(sink)
        return sink

    yield make
    for sink in sinks:
        sink.close()


@pytest.fixture
def firehose(moto: MotoServer, s3: Any) -> Any:  # noqa: F811
    client = moto.client("firehose")
    client.create_delivery_stream(
        DeliveryStreamName=STREAM,
        ExtendedS3DestinationConfiguration={
            "RoleARN": "arn:aws:iam::123456789012:role/firehose",
            "BucketARN": f"arn:aws:s3:::{BUCKET}",
            "Prefix": "firehose/",
        },
    )
    return client


@pytest.fixture
def make_firehose(firehose: Any, s3: Any) -> Iterator[Callable[..., FirehoseHistory]]:
    """Builds `FirehoseHistory` sinks on the test stream, reading back through its bucket."""
    sinks: list[FirehoseHistory] = []

    def make(client: Any = None, **options: Any) -> FirehoseHistory:
        options.setdefault("flush_s", 60)
        options.setdefault("backoff_s", 0.001)
        reader = S3EventScanner(s3, BUCKET, "firehose", layout=FIREHOSE, early_ms=HOUR_MS, late_ms=HOUR_MS)
        sink = FirehoseHistory(firehose if client is None else client, STREAM, reader=reader, **options)
        sinks.append(sink)
        return sink

    yield make
    for sink in sinks:
        sink.close()


def _dead_client(service: str) -> Any:
    """A client for an endpoint where nothing listens, tried once per call."""
    from botocore.config import Config

    return aws_client(
        service,
        region="us-east-1",
        endpoint=f"http://127.0.0.1:{free_port()}",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"mode": "standard", "max_attempts": 1}, connect_timeout=1),
    )


# --- S3: layout -------------------------------------------------------------------------------


def test_objects_are_partitioned_by_the_event_hour_in_utc_not_the_upload_time(
    make_s3: Callable[..., S3History], s3: Any
) -> None:
    upload_ms = T0 + 5 * DAY_MS
    sink = make_s3(clock=ManualClock(upload_ms))
    sink.record([_event(_ms("2026-09-21T23:59:59.999")), _event(_ms("2026-09-22T00:00:00.000"))])
    sink.flush()
    keys = list(_objects(s3))
    assert len(keys) == 2
    parts = [KEY.fullmatch(key) for key in keys]
    assert all(parts), keys
    assert [(m.group(1), m.group(2)) for m in parts if m] == [("2026-09-21", "23"), ("2026-09-22", "00")]
    assert all(int(m.group(3)) == upload_ms for m in parts if m)  # the name carries the upload time


def test_a_buffer_spanning_two_hours_writes_one_object_per_hour(make_s3: Callable[..., S3History], s3: Any) -> None:
    sink = make_s3()
    sink.record([_event(HOUR + 1, n=1), _event(HOUR + HOUR_MS + 1, n=2), _event(HOUR + 2, n=3)])
    sink.flush()
    objects = _objects(s3)
    assert [HIVE.hour_of(key.removeprefix("history/")) for key in objects] == [HOUR, HOUR + HOUR_MS]
    assert [[e.attempt for e in _lines(data)] for data in objects.values()] == [[1, 3], [2]]


def test_objects_are_gzipped_ndjson_by_default(make_s3: Callable[..., S3History], s3: Any) -> None:
    sink = make_s3()
    events = [_event(T0, n=1), _event(T0 + 1, n=2, kind="FAILED", error="boom\nline two")]
    sink.record(events)
    sink.flush()
    (object_key,) = [item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET)["Contents"]]
    raw = s3.get_object(Bucket=BUCKET, Key=object_key)["Body"].read()
    assert object_key.endswith(".ndjson.gz")
    assert _lines(gzip.decompress(raw)) == events


def test_compression_none_writes_plain_ndjson(make_s3: Callable[..., S3History], s3: Any) -> None:
    sink = make_s3(compression="none")
    sink.record([_event(T0)])
    sink.read(key("job_1"))  # read flushes first
    (object_key,) = [item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET)["Contents"]]
    raw = s3.get_object(Bucket=BUCKET, Key=object_key)["Body"].read()
    assert object_key.endswith(".ndjson")
    assert raw == _event(T0).model_dump_json().encode() + b"\n"


def test_keys_never_collide_between_sinks_or_flushes(make_s3: Callable[..., S3History], s3: Any) -> None:
    clock = ManualClock(T0)  # the same millisecond for every object
    first, second = make_s3(clock=clock), make_s3(clock=clock)
    for sink in (first, second, first, second):
        sink.record([_event(T0)])
        sink.flush()
    objects = _objects(s3)
    assert len(objects) == 4
    assert all(len(_lines(data)) == 1 for data in objects.values())


def test_a_key_that_is_already_taken_is_never_overwritten(make_s3: Callable[..., S3History], s3: Any) -> None:
    sink = make_s3(compression="none")
    taken = sink.key(HOUR)
    s3.put_object(Bucket=BUCKET, Key=taken, Body=b"another process's object\n")
    keys = iter([taken])
    fresh = sink.key
    sink.key = lambda hour_ms: next(keys, None) or fresh(hour_ms)  # type: ignore[method-assign]
    sink.record([_event(T0)])
    sink.flush()
    objects = _objects(s3)
    assert objects.pop(taken) == b"another process's object\n"
    assert [_lines(data) for data in objects.values()] == [[_event(T0)]]


# --- S3: flushing -----------------------------------------------------------------------------


def test_nothing_is_uploaded_before_the_size_or_the_interval_is_reached(
    make_s3: Callable[..., S3History], s3: Any
) -> None:
    sink = make_s3(flush_s=60)
    sink.record([_event(T0)])
    time.sleep(0.3)
    assert _objects(s3) == {}
    sink.flush()
    assert len(_objects(s3)) == 1


def test_a_full_buffer_is_uploaded_without_waiting_for_the_interval(make_s3: Callable[..., S3History], s3: Any) -> None:
    sink = make_s3(flush_s=60, flush_bytes=2000)
    sink.record([_event(T0, n=n) for n in range(20)])  # ~4 KB of NDJSON
    assert _wait_until(lambda: len(_objects(s3)) == 1)
    assert [e.attempt for data in _objects(s3).values() for e in _lines(data)] == list(range(20))


def test_a_small_buffer_is_uploaded_every_interval(make_s3: Callable[..., S3History], s3: Any) -> None:
    sink = make_s3(flush_s=0.2)
    sink.record([_event(T0)])
    assert _wait_until(lambda: len(_objects(s3)) == 1)
    sink.record([_event(T0 + 1)])
    assert _wait_until(lambda: len(_objects(s3)) == 2)


# --- S3: failures -----------------------------------------------------------------------------


def test_a_failed_upload_keeps_its_events_for_the_next_flush(make_s3: Callable[..., S3History], s3: Any) -> None:
    failures = [_client_error("InternalError", 500, "PutObject")]

    def put_object(**kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return s3.put_object(**kwargs)

    errors_before = METRICS.history_errors.value()
    sink = make_s3(Spy(s3, put_object=put_object))
    sink.record([_event(T0, n=1), _event(T0, n=2)])
    sink.flush()
    assert _objects(s3) == {}
    sink.record([_event(T0, n=3)])
    sink.flush()
    assert [[e.attempt for e in _lines(data)] for data in _objects(s3).values()] == [[1, 2, 3]]
    assert METRICS.history_errors.value() == errors_before


def test_a_full_buffer_drops_new_events_and_counts_them(make_s3: Callable[..., S3History], s3: Any) -> None:
    healthy = False

    def put_object(**kwargs: Any) -> Any:
        if not healthy:
            raise _client_error("SlowDown", 503, "PutObject")
        return s3.put_object(**kwargs)

    line_bytes = len(_event(T0).model_dump_json()) + 1
    sink = make_s3(Spy(s3, put_object=put_object), max_buffer_bytes=3 * line_bytes)
    errors_before = METRICS.history_errors.value()
    for n in range(5):
        sink.record([_event(T0, n=n)])
        sink.flush()
    assert METRICS.history_errors.value() == errors_before + 2
    healthy = True
    sink.flush()
    assert [[e.attempt for e in _lines(data)] for data in _objects(s3).values()] == [[0, 1, 2]]


def test_record_never_raises_when_the_endpoint_is_down(make_s3: Callable[..., S3History]) -> None:
    client = _dead_client("s3")
    sink = make_s3(client)
    errors_before = METRICS.history_errors.value()
    sink.record([_event(T0, n=n) for n in range(3)])
    sink.flush()
    with pytest.raises(StoreUnavailable) as raised:
        sink.read(key("job_1"))
    assert raised.value.retryable
    sink.close()  # its last try fails too: the events are dropped and counted
    client.close()
    assert METRICS.history_errors.value() == errors_before + 3
    sink.record([_event(T0)])  # after close: still no exception, one more counted
    assert METRICS.history_errors.value() == errors_before + 4


def test_reading_a_missing_bucket_is_a_store_error_that_retrying_will_not_fix(
    make_s3: Callable[..., S3History], s3: Any
) -> None:
    sink = S3History(s3, "jobq-no-such-bucket", clock=ManualClock(T0))
    try:
        with pytest.raises(StoreError) as raised:
            sink.read(key("job_1"))
    finally:
        sink.close()
    assert not raised.value.retryable
    assert "NoSuchBucket" in str(raised.value)


# --- S3: reading ------------------------------------------------------------------------------


def test_read_starts_at_the_creation_hour_of_a_jobq_job_id(make_s3: Callable[..., S3History], s3: Any) -> None:
    job = new_job_id(T0)
    sink = make_s3(clock=ManualClock(T0 + 30 * DAY_MS))  # far beyond the 7-day look-back
    planted = _event(T0 - 3 * HOUR_MS, job=job, n=0)  # before the job existed: outside the scan
    sink.record([planted, _event(T0 + 60_000, job=job, n=1), _event(T0 + 2 * HOUR_MS, job=job, n=2)])
    sink.record([_event(T0, job="job_other")])
    assert sink.reader.start_ms(job) == (T0 - CLOCK_SKEW_MS) - (T0 - CLOCK_SKEW_MS) % HOUR_MS
    assert [e.attempt for e in sink.read(key(job))] == [1, 2]


def test_read_of_a_custom_job_id_looks_back_lookback_days(make_s3: Callable[..., S3History]) -> None:
    sink = make_s3(clock=ManualClock(T0), lookback_days=7)
    sink.record([_event(T0 - 10 * DAY_MS, job="billing-nightly", n=1), _event(T0 - DAY_MS, job="billing-nightly", n=2)])
    assert [e.attempt for e in sink.read(key("billing-nightly"))] == [2]


def test_read_returns_oldest_first_across_objects_and_processes(make_s3: Callable[..., S3History]) -> None:
    early, late = make_s3(), make_s3()
    late.record([_event(T0 + 2, n=3)])
    late.flush()  # the later event's object is written first
    early.record([_event(T0 + 1, n=2), _event(T0, n=1)])
    assert [e.attempt for e in early.read(key("job_1"))] == [1, 2, 3]


def test_read_stops_listing_after_the_hour_that_completes_the_limit(make_s3: Callable[..., S3History], s3: Any) -> None:
    spy = Spy(s3)
    sink = make_s3(spy)
    for hour in range(3):
        sink.record([_event(HOUR + hour * HOUR_MS, n=hour)])
        sink.flush()
    assert [e.attempt for e in sink.read(key("job_1"), limit=1)] == [0]
    assert spy.count("get_object") == 1
    assert [e.attempt for e in sink.read(key("job_1"), limit=2)] == [0, 1]
    assert spy.count("get_object") == 3


def test_a_scan_past_its_bound_raises_rather_than_run_on(make_s3: Callable[..., S3History]) -> None:
    sink = make_s3(scan_objects=2)
    for n in range(3):
        sink.record([_event(T0 + n, job=f"job_other_{n}")])
        sink.flush()
    sink.record([_event(T0 + 10)])
    with pytest.raises(StoreError, match="Athena"):
        sink.read(key("job_1"))


def test_job_created_ms_decodes_jobq_ids_and_nothing_else() -> None:
    job = new_job_id(T0)
    assert job_created_ms(job, T0) == T0
    assert job_created_ms(job.upper().replace("JOB_", "job_"), T0) == T0
    assert job_created_ms("job_1", T0) is None
    assert job_created_ms("job_" + "z" * 26, T0) is None  # a "time" centuries ahead: a custom id
    assert job_created_ms("billing-nightly", T0) is None


def test_records_from_many_threads_are_written_exactly_once(make_s3: Callable[..., S3History]) -> None:
    sink = make_s3(flush_bytes=3000)  # small: the flusher ships while the threads still record

    def work(thread: int) -> None:
        for n in range(50):
            sink.record([_event(T0 + n, job=f"job_t{thread}", n=n)])

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for t in range(8):
        assert [e.attempt for e in sink.read(key(f"job_t{t}"))] == list(range(50))


# --- S3: configuration ------------------------------------------------------------------------


def test_without_boto3_the_error_names_the_aws_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # makes `import boto3` raise ImportError
    with pytest.raises(MissingExtra, match=r"jobq\[aws\]"):
        S3History.from_url("s3://bucket/prefix?region=us-east-1")


def test_from_url_reads_every_option(moto: MotoServer) -> None:  # noqa: F811
    url = (
        f"s3://{BUCKET}/a/b/?region=us-east-1&endpoint={moto.endpoint_url}&flush_s=5&flush_bytes=1000"
        "&max_buffer_bytes=9000&compression=none&lookback_days=2&scan_bytes=77&scan_objects=3"
    )
    sink = S3History.from_url(url, aws_access_key_id="testing", aws_secret_access_key="testing")
    try:
        assert (sink.bucket, sink.root, sink.flush_s, sink.flush_bytes) == (BUCKET, "a/b/", 5.0, 1000)
        assert (sink.max_buffer_bytes, sink.compression) == (9000, "none")
        reader = sink.reader
        assert (reader.lookback_ms, reader.scan_bytes, reader.scan_objects) == (2 * DAY_MS, 77, 3)
    finally:
        sink.close()


@pytest.mark.parametrize(
    "url",
    [
        "s3:///prefix",
        "s3://bucket/p?flush_sec=5",
        "s3://bucket/p?flush_s=soon",
        "s3://bucket/p?flush_bytes=0",
        "s3://bucket/p?compression=zstd",
    ],
)
def test_from_url_refuses_a_bad_url_naming_it(url: str) -> None:
    with pytest.raises(ConfigError):
        S3History.from_url(url, region_name="us-east-1")


@pytest.fixture
def no_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An empty boto3 credential chain: a client that works took its credentials from the URL."""
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_s3_urls_take_credentials_for_a_local_endpoint(
    moto: MotoServer,  # noqa: F811
    s3: Any,
    no_aws_credentials: None,
) -> None:
    url = f"s3://{BUCKET}/history?region=us-east-1&endpoint={moto.endpoint_url}"
    sink = S3History.from_url(f"{url}&aws_access_key_id=testing&aws_secret_access_key=testing", clock=ManualClock(T0))
    try:
        sink.record([_event(T0)])
        assert sink.read(key("job_1")) == [_event(T0)]
    finally:
        sink.close()


def test_firehose_urls_take_credentials_for_a_local_endpoint(
    moto: MotoServer,  # noqa: F811
    firehose: Any,
    no_aws_credentials: None,
) -> None:
    url = (
        f"firehose://{STREAM}?region=us-east-1&endpoint={moto.endpoint_url}&s3=s3://{BUCKET}/firehose"
        "&aws_access_key_id=testing&aws_secret_access_key=testing"
    )
    sink = FirehoseHistory.from_url(url)
    now_ms = int(time.time() * 1000)
    job = new_job_id(now_ms)
    try:
        sink.record([_event(now_ms, job=job)])
        assert sink.read(key(job)) == [_event(now_ms, job=job)]
    finally:
        sink.close()


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("s3://bucket/p?aws_access_key_id=a&aws_secret_access_key=b", "history.aws_access_key_id"),
        ("s3://bucket/p?endpoint=http://127.0.0.1:9&aws_access_key_id=a", "history.aws_secret_access_key"),
        ("firehose://s?aws_access_key_id=a&aws_secret_access_key=b", "history.aws_access_key_id"),
        ("firehose://s?endpoint=http://127.0.0.1:9&aws_secret_access_key=b", "history.aws_secret_access_key"),
    ],
)
def test_credentials_in_a_history_url_need_an_endpoint_and_each_other(url: str, key: str) -> None:
    sink = S3History if url.startswith("s3") else FirehoseHistory
    with pytest.raises(ConfigError) as raised:
        sink.from_url(url, region_name="us-east-1")
    assert raised.value.key == key
    assert str(raised.value).startswith(f"{key}='***'")  # the secret is never echoed


# --- Firehose -----------------------------------------------------------------------------------


def test_put_record_batch_resends_exactly_the_records_that_failed(
    make_firehose: Callable[..., FirehoseHistory], firehose: Any
) -> None:
    failing = {1, 3}

    def put_record_batch(**kwargs: Any) -> Any:
        if not failing:
            return firehose.put_record_batch(**kwargs)
        records = kwargs["Records"]
        passed = [r for i, r in enumerate(records) if i not in failing]
        firehose.put_record_batch(DeliveryStreamName=kwargs["DeliveryStreamName"], Records=passed)
        entries = [
            {"ErrorCode": "ServiceUnavailableException", "ErrorMessage": "Slow down."}
            if i in failing
            else {"RecordId": str(i)}
            for i in range(len(records))
        ]
        failing.clear()
        return {"FailedPutCount": 2, "RequestResponses": entries}

    spy = Spy(firehose, put_record_batch=put_record_batch)
    job = new_job_id(int(time.time() * 1000))
    sink = make_firehose(spy, record_bytes=0)  # one event per record
    events = [_event(int(time.time() * 1000) + n, job=job, n=n) for n in range(5)]
    sink.record(events)
    sink.flush()
    first, second = (kwargs["Records"] for _, kwargs in spy.calls)
    assert [r["Data"] for r in second] == [first[1]["Data"], first[3]["Data"]]
    assert sink.read(key(job)) == events


def test_records_still_failing_after_the_retries_are_dropped_and_counted(
    make_firehose: Callable[..., FirehoseHistory], firehose: Any
) -> None:
    poison = _event(T0, job="job_poison").model_dump_json().encode() + b"\n"

    def put_record_batch(**kwargs: Any) -> Any:
        records = kwargs["Records"]
        passed = [r for r in records if r["Data"] != poison]
        if passed:
            firehose.put_record_batch(DeliveryStreamName=kwargs["DeliveryStreamName"], Records=passed)
        entries = [{"ErrorCode": "InternalFailure"} if r["Data"] == poison else {"RecordId": "x"} for r in records]
        return {"FailedPutCount": len(records) - len(passed), "RequestResponses": entries}

    spy = Spy(firehose, put_record_batch=put_record_batch)
    sink = make_firehose(spy, record_bytes=0, retries=2)
    errors_before = METRICS.history_errors.value()
    sink.record([_event(T0, job="job_poison"), _event(T0, job="job_fine")])
    sink.flush()
    assert [len(kwargs["Records"]) for _, kwargs in spy.calls] == [2, 1, 1]
    assert METRICS.history_errors.value() == errors_before + 1
    assert [e.job_id for e in sink.read(key("job_fine"))] == ["job_fine"]


def test_a_call_that_fails_as_a_whole_keeps_its_events_for_the_next_flush(
    make_firehose: Callable[..., FirehoseHistory], firehose: Any
) -> None:
    failures = [_client_error("ServiceUnavailableException", 503, "PutRecordBatch")]

    def put_record_batch(**kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return firehose.put_record_batch(**kwargs)

    spy = Spy(firehose, put_record_batch=put_record_batch)
    sink = make_firehose(spy)
    errors_before = METRICS.history_errors.value()
    sink.record([_event(T0, n=1)])
    sink.flush()
    sink.flush()
    assert spy.count("put_record_batch") == 2
    assert [e.attempt for e in sink.read(key("job_1"))] == [1]
    assert METRICS.history_errors.value() == errors_before


def test_501_records_take_two_calls(make_firehose: Callable[..., FirehoseHistory], firehose: Any) -> None:
    spy = Spy(firehose)
    sink = make_firehose(spy, record_bytes=0)
    sink.record([_event(T0 + n, n=n) for n in range(501)])
    sink.flush()
    assert [len(kwargs["Records"]) for _, kwargs in spy.calls] == [500, 1]
    assert [e.attempt for e in sink.read(key("job_1"))] == list(range(501))


def test_events_are_packed_into_records_of_at_most_record_bytes(
    make_firehose: Callable[..., FirehoseHistory], firehose: Any
) -> None:
    spy = Spy(firehose)
    sink = make_firehose(spy, record_bytes=1000)
    events = [_event(T0 + n, n=n) for n in range(10)]
    sink.record(events)
    sink.flush()
    ((_, kwargs),) = spy.calls
    records = [r["Data"] for r in kwargs["Records"]]
    assert 1 < len(records) < len(events)
    assert all(len(data) <= 1000 and data.endswith(b"\n") for data in records)
    assert b"".join(records) == b"".join(e.model_dump_json().encode() + b"\n" for e in events)


def test_pack_keeps_lines_whole_and_a_long_line_alone() -> None:
    lines = [Line(0, b"a" * 99 + b"\n"), Line(0, b"b" * 99 + b"\n"), Line(0, b"c" * 299 + b"\n"), Line(0, b"d\n")]
    assert [[line.data[:1] for line in record] for record in pack(lines, 250)] == [[b"a", b"b"], [b"c"], [b"d"]]
    assert len(pack(lines, 0)) == 4


def test_calls_hold_at_most_4_mib() -> None:
    record = [Line(0, b"x" * (900 * 1024))]
    calls = list(batches([record] * 5))
    assert [len(call) for call in calls] == [4, 1]
    assert all(sum(len(line.data) for rec in call for line in rec) <= MAX_BATCH_BYTES for call in calls)


def test_an_event_too_large_for_a_record_keeps_a_truncated_error(
    make_firehose: Callable[..., FirehoseHistory], firehose: Any
) -> None:
    spy = Spy(firehose)
    sink = make_firehose(spy)
    sink.record([_event(T0, kind="FAILED", error="\n" * (2 * MAX_RECORD_BYTES))])
    sink.flush()
    ((_, kwargs),) = spy.calls
    (data,) = [r["Data"] for r in kwargs["Records"]]
    assert len(data) <= MAX_RECORD_BYTES
    (event,) = sink.read(key("job_1"))
    assert event.error is not None and event.error.endswith("too large for a Firehose record]")


def test_firehose_read_without_its_s3_destination_is_a_config_error(firehose: Any) -> None:
    sink = FirehoseHistory(firehose, STREAM)
    try:
        with pytest.raises(ConfigError, match="s3=s3://"):
            sink.read(key("job_1"))
    finally:
        sink.close()


def test_firehose_record_never_raises_when_the_endpoint_is_down() -> None:
    client = _dead_client("firehose")
    sink = FirehoseHistory(client, STREAM, flush_s=60)
    errors_before = METRICS.history_errors.value()
    sink.record([_event(T0, n=n) for n in range(3)])
    sink.flush()
    sink.close()
    client.close()
    assert METRICS.history_errors.value() == errors_before + 3


def test_firehose_from_url_reads_the_destination(moto: MotoServer) -> None:  # noqa: F811
    url = (
        f"firehose://{STREAM}?region=us-east-1&endpoint={moto.endpoint_url}&s3=s3://{BUCKET}/fh&s3_layout=hive"
        "&slack_s=600&record_bytes=0&retries=5&flush_s=2"
    )
    sink = FirehoseHistory.from_url(url, aws_access_key_id="testing", aws_secret_access_key="testing")
    try:
        assert (sink.stream, sink.record_bytes, sink.retries, sink.flush_s) == (STREAM, 0, 5, 2.0)
        assert sink.reader is not None
        assert (sink.reader.bucket, sink.reader.root, sink.reader.layout) == (BUCKET, "fh/", HIVE)
        assert sink.reader.early_ms == sink.reader.late_ms == 600_000
    finally:
        sink.close()


@pytest.mark.parametrize(
    "url",
    ["firehose://", "firehose://a/b", "firehose://s?s3_layout=daily", "firehose://s?s3=http://x", "firehose://s?x=1"],
)
def test_firehose_from_url_refuses_a_bad_url(url: str) -> None:
    with pytest.raises(ConfigError):
        FirehoseHistory.from_url(url, region_name="us-east-1")
