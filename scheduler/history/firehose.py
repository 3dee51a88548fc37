"""History through Amazon Data Firehose (Kinesis Data Firehose): `PutRecordBatch` of NDJSON.

URL ``firehose://STREAM?region=…&endpoint=…&s3=s3://BUCKET/PREFIX`` (options: `FirehoseHistory.from_url`);
``region``, ``endpoint`` and the credential pair mean what they mean in every AWS URL (`jobq.aws`).

Writing: `record` buffers (as `S3History` does; see `jobq.history.buffered`) and a background thread
sends every ``flush_s`` (1 s: Firehose buffers again on its side) or at ``flush_bytes``. Events
are NDJSON lines, packed whole into records of up to ``record_bytes`` (64 KiB), because Firehose
bills every record rounded up to 5 KB: one ~300-byte event per record would be billed about 17
times its size, and packing also keeps far under the stream's records-per-second quota. Firehose
concatenates record data as it is, so the S3 objects are NDJSON either way. Set ``record_bytes=0``
for one event per record when the stream needs it (dynamic partitioning on the event, a record
format conversion or a Lambda transformation that expects one document per record).

Each call carries at most 500 records and 4 MiB. When the response marks records with an
``ErrorCode`` (throttling, an internal failure), exactly those records are sent again, with
full-jitter backoff, ``retries`` times (3), then dropped, counted in `jobq_history_errors_total`
and logged. A call that fails as a whole for a transient reason (no connection, throttling, 5xx)
keeps its events for the next flush, within ``max_buffer_bytes``; a call Firehose rejects as
invalid is dropped and counted. An event too large for one record (1,000 KiB) has its error text
truncated to fit.

Reading: Firehose is write-only, so `read` reads the stream's S3 destination, given as
``s3=s3://BUCKET/PREFIX`` (its bucket and prefix), with `S3EventScanner` (`jobq.history.s3scanner`).
Those partitions name the delivery time, not the event time: the scan starts ``slack_s`` (1 h)
before the job's creation and goes on ``slack_s`` past the last event it needs. Firehose's default layout is
``PREFIX/YYYY/MM/DD/HH/`` (``s3_layout=firehose``); a custom prefix of the form
``PREFIX/dt=!{timestamp:yyyy-MM-dd}/hour=!{timestamp:HH}/`` is ``s3_layout=hive``. Time prefixes
must be UTC (no ``CustomTimeZone``). Events appear there only once Firehose has delivered them,
after its own buffering interval (up to 15 minutes). Without ``s3=``, `read` raises `ConfigError`.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from jobq.aws import AwsOptions, UrlOptions, aws_error_code, require_aws
from jobq.clock import SYSTEM_CLOCK, Clock
from jobq.errors import ConfigError
from jobq.history.buffered import Line, NdjsonSink
from jobq.history.s3scanner import DAY_MS, LAYOUTS, MiB, S3EventScanner, split_s3_url
from jobq.metrics import METRICS
from jobq.models import JobKey, RunEvent

log = logging.getLogger("jobq.history")

# PutRecordBatch limits: 500 records and 4 MiB of data per call, 1,000 KiB per record.
MAX_BATCH_RECORDS = 500
MAX_BATCH_BYTES = 4 * MiB
MAX_RECORD_BYTES = 1000 * 1024
# The call itself is malformed: sending it again can only fail again.
_INVALID = frozenset({"InvalidArgumentException", "ValidationException", "SerializationException"})
_TRUNCATED = " …[truncated by jobq: too large for a Firehose record]"


class FirehoseHistory(NdjsonSink):
    """`HistorySink` sending to a Firehose stream; see the module docstring.

    Thread-safe. `record`, `flush` and `close` never raise. `read` raises `ConfigError` when no S3
    destination was given, else what `S3EventScanner.read` raises.
    """

    def __init__(
        self,
        client: Any,
        stream: str,
        *,
        reader: S3EventScanner | None = None,
        flush_s: float = 1.0,
        flush_bytes: int = MAX_BATCH_BYTES,
        max_buffer_bytes: int = 64 * MiB,
        record_bytes: int = 64 * 1024,
        retries: int = 3,
        backoff_s: float = 0.1,
        owned_clients: Iterable[Any] = (),
    ) -> None:
        self.client = client
        self.stream = stream
        self.reader = reader
        self.record_bytes = min(record_bytes, MAX_RECORD_BYTES)
        self.retries = retries
        self.backoff_s = backoff_s
        self._owned = list(owned_clients)
        super().__init__(name="firehose", flush_s=flush_s, flush_bytes=flush_bytes, max_buffer_bytes=max_buffer_bytes)

    @classmethod
    def from_url(cls, url: str, *, clock: Clock = SYSTEM_CLOCK, **client_kwargs: Any) -> FirehoseHistory:
        """``firehose://STREAM`` with options ``region``, ``endpoint``, ``aws_access_key_id`` and
        ``aws_secret_access_key`` (with ``endpoint`` only; all four also used for S3), ``flush_s``
        (1), ``flush_bytes`` (4 MiB), ``max_buffer_bytes`` (64 MiB), ``record_bytes`` (64 KiB; 0 =
        one event per record), ``retries`` (3), and for `read`: ``s3`` (``s3://BUCKET/PREFIX`` of
        the stream's destination), ``s3_layout`` (firehose|hive), ``slack_s`` (3600),
        ``lookback_days`` (7), ``scan_bytes`` (256 MiB), ``scan_objects`` (2000). `client_kwargs`
        go to both clients (`jobq.aws.aws_client`). Raises `ConfigError` naming a bad option,
        `MissingExtra` without boto3."""
        parts = urlsplit(url)
        stream = parts.netloc
        if parts.scheme != "firehose" or not stream or parts.path.strip("/"):
            raise ConfigError("history", url, "expected firehose://STREAM_NAME")
        options = UrlOptions(url, "history")
        aws = AwsOptions.read(options)
        settings: dict[str, Any] = {
            "flush_s": options.number("flush_s", 1.0, minimum=0.01),
            "flush_bytes": options.integer("flush_bytes", MAX_BATCH_BYTES, minimum=1),
            "max_buffer_bytes": options.integer("max_buffer_bytes", 64 * MiB, minimum=1),
            "record_bytes": options.integer("record_bytes", 64 * 1024),
            "retries": options.integer("retries", 3),
        }
        destination = options.text("s3")
        layout_name = options.text("s3_layout", "firehose") or ""
        slack_ms = round(options.number("slack_s", 3600.0) * 1000)
        scan = {
            "lookback_ms": round(options.number("lookback_days", 7.0) * DAY_MS),
            "scan_bytes": options.integer("scan_bytes", 256 * MiB, minimum=1),
            "scan_objects": options.integer("scan_objects", 2000, minimum=1),
        }
        options.done()
        if layout_name not in LAYOUTS:
            raise ConfigError(options.key("s3_layout"), layout_name, f"use one of {', '.join(LAYOUTS)}")
        clients: list[Any] = []
        try:
            reader = None
            if destination:
                bucket, prefix = split_s3_url(destination)
                s3 = aws.client("s3", feature="the Firehose history", scope="history", **client_kwargs)
                clients.append(s3)
                reader = S3EventScanner(
                    s3,
                    bucket,
                    prefix,
                    layout=LAYOUTS[layout_name],
                    clock=clock,
                    early_ms=slack_ms,
                    late_ms=slack_ms,
                    **scan,
                )
            firehose = aws.client("firehose", feature="the Firehose history", scope="history", **client_kwargs)
            clients.append(firehose)
            return cls(firehose, stream, reader=reader, owned_clients=clients, **settings)
        except BaseException:
            for client in clients:
                client.close()
            raise

    def read(self, job: JobKey, limit: int = 1000) -> list[RunEvent]:
        """The job's events, oldest first, as delivered to the stream's S3 destination; this
        sink's buffer is sent first."""
        if self.reader is None:
            raise ConfigError(
                "history",
                f"firehose://{self.stream}",
                "Firehose is write-only: reading history needs the stream's S3 destination; "
                "add s3=s3://BUCKET/PREFIX (its bucket and prefix) to the URL",
            )
        self.flush()
        return self.reader.read(job, limit)

    def _encode(self, event: RunEvent) -> bytes:
        line = super()._encode(event)
        text = event.error or ""
        # Firehose refuses a record over 1,000 KiB: the event is worth keeping, a runaway error
        # text in full is not. JSON escaping makes bytes and characters differ, hence the loop.
        for _ in range(4):
            if len(line) <= MAX_RECORD_BYTES:
                return line
            text = text[: max(0, len(text) * (MAX_RECORD_BYTES - 4096) // len(line))]
            line = super()._encode(event.model_copy(update={"error": text + _TRUNCATED}))
        if len(line) <= MAX_RECORD_BYTES:
            return line
        raise ValueError(f"run event of {event.run_id!r} is {len(line)} bytes, over Firehose's record limit")

    def _ship(self, batch: list[Line]) -> list[Line]:
        calls = list(batches(pack(batch, self.record_bytes)))
        for done, call in enumerate(calls):
            kept = self._send(call)
            if kept:
                return kept + [line for later in calls[done + 1 :] for record in later for line in record]
        return []

    def _send(self, records: list[list[Line]]) -> list[Line]:
        """One PutRecordBatch, then its failed records again; returns the lines to keep for the
        next flush (a transient failure of a whole call)."""
        pending = records
        codes: Counter[str] = Counter()
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(random.uniform(0, min(2.0, self.backoff_s * 2 ** (attempt - 1))))  # full jitter
            try:
                response = self.client.put_record_batch(
                    DeliveryStreamName=self.stream,
                    Records=[{"Data": b"".join(line.data for line in record)} for record in pending],
                )
            except Exception as exc:
                lines = [line for record in pending for line in record]
                if _is_invalid(exc):
                    METRICS.history_errors.inc(len(lines))
                    log.error(
                        "Firehose %s refused a call as invalid (%s: %s); %d events dropped",
                        self.stream,
                        type(exc).__name__,
                        exc,
                        len(lines),
                    )
                    return []
                # Transient, or possibly so (credentials being refreshed, a stream being created):
                # the buffer bound decides when waiting stops.
                log.warning(
                    "Firehose %s call failed (%s: %s); %d events kept for the next flush",
                    self.stream,
                    type(exc).__name__,
                    exc,
                    len(lines),
                )
                return lines
            if not response.get("FailedPutCount"):
                return []
            entries = response.get("RequestResponses", [])
            codes = Counter(entry["ErrorCode"] for entry in entries if entry.get("ErrorCode"))
            pending = [record for record, entry in zip(pending, entries, strict=False) if entry.get("ErrorCode")]
            if not pending:
                return []
        lines = [line for record in pending for line in record]
        METRICS.history_errors.inc(len(lines))
        log.error(
            "Firehose %s refused %d records (%d events) on %d tries (%s); dropped",
            self.stream,
            len(pending),
            len(lines),
            self.retries + 1,
            dict(codes),
        )
        return []

    def _release(self) -> None:
        for client in self._owned:
            client.close()


def _is_invalid(exc: Exception) -> bool:
    """The call is malformed (by Firehose's verdict, or botocore's before sending): sending it
    again can only fail again."""
    if aws_error_code(exc) in _INVALID:
        return True
    return isinstance(exc, require_aws("botocore.exceptions", "the Firehose history").ParamValidationError)


def pack(lines: list[Line], record_bytes: int) -> list[list[Line]]:
    """Whole lines into records of at most `record_bytes` (a longer line is a record alone)."""
    records: list[list[Line]] = []
    current: list[Line] = []
    size = 0
    for line in lines:
        if current and size + len(line.data) > record_bytes:
            records.append(current)
            current, size = [], 0
        current.append(line)
        size += len(line.data)
    if current:
        records.append(current)
    return records


def batches(records: list[list[Line]]) -> Iterable[list[list[Line]]]:
    """Records into PutRecordBatch calls of at most 500 records and 4 MiB."""
    call: list[list[Line]] = []
    size = 0
    for record in records:
        record_size = sum(len(line.data) for line in record)
        if call and (len(call) == MAX_BATCH_RECORDS or size + record_size > MAX_BATCH_BYTES):
            yield call
            call, size = [], 0
        call.append(record)
        size += record_size
    if call:
        yield call
