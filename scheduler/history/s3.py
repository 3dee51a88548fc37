"""History in S3: NDJSON objects partitioned by the events' UTC hour, for Athena or Glue to query.

URL ``s3://BUCKET/PREFIX?region=…&endpoint=…&flush_s=60&flush_bytes=5242880&compression=gzip``;
every option is optional (``S3History.from_url`` lists them) and an unknown one is refused.
``region``, ``endpoint`` and the credential pair mean what they mean in every AWS URL (`jobq.aws`).
Objects, one per hour partition per flush::

    PREFIX/dt=YYYY-MM-DD/hour=HH/<unix_ms>-<host>-<pid>-<nonce>-<seq>.ndjson.gz

- One ``RunEvent`` JSON per line. Gzip by default (``compression=none`` writes plain ``.ndjson``):
  history is about 15 TB of JSON a month, gzip shrinks it several times over, which cuts both S3
  storage and the bytes Athena bills per query, and Athena, Glue, Spark and ``zcat`` read gzipped
  NDJSON as it is.
- Partitioned by each event's ``at_ms`` in UTC, not by upload time, so ``dt`` and ``hour`` are
  true partition columns (Athena partition projection: ``dt`` a date, ``hour`` an integer); a
  buffer that spans hours writes one object per hour.
- Keys never collide: ``<host>-<pid>`` names the process, a random per-process ``<nonce>`` covers
  pid reuse by containers that share a host name, ``<seq>`` counts the process's objects; and
  every write is conditional (``If-None-Match: *``), so a key taken anyway is never overwritten:
  the write moves to the next key.

``record`` never waits on the network: it encodes and appends to a buffer (`jobq.history.buffered`),
and a background thread uploads when ``flush_bytes`` of NDJSON are buffered or every ``flush_s``; ``flush`` and
``close`` upload too. A failed upload keeps its events for the next flush. The buffer (in-flight
events included) is bounded by ``max_buffer_bytes``: beyond it new events are dropped, as are
events ``close`` could not upload, and all of those are counted in ``jobq_history_errors_total``
and logged. Events buffered when the process is killed are lost; the store still holds every
run's outcome.

Reading is the expensive part: S3 has no index, so ``read`` lists and downloads every object from
a start hour onwards and filters lines by job id (see ``S3EventScanner``). It suits development
and small deployments; at production volume the query path is Athena (or Glue, Trino, Spark)
over the same partitions, and ``read`` refuses scans beyond ``scan_bytes``/``scan_objects``.
"""

from __future__ import annotations

import calendar
import contextlib
import gzip
import heapq
import itertools
import logging
import os
import re
import secrets
import socket
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from jobq.aws import AwsOptions, UrlOptions, aws_error_code, translate_aws_error
from jobq.clock import SYSTEM_CLOCK, Clock
from jobq.errors import ConfigError, JobqError, StoreError
from jobq.history.buffered import Line, NdjsonSink
from jobq.models import RunEvent

log = logging.getLogger("jobq.history")

MiB = 1024 * 1024
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
# The clock that minted a job id and the clocks that time its events disagree by seconds, rarely
# minutes: scans start this much before the job's creation.
CLOCK_SKEW_MS = 5 * 60_000
_GZIP_MAGIC = b"\x1f\x8b"
# A conditional PUT lost to an object (or a concurrent write) under the same key.
_KEY_TAKEN = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})


def split_s3_url(url: str) -> tuple[str, str]:
    """`s3://BUCKET/PREFIX` as (bucket, prefix); raises `ConfigError` without a bucket."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise ConfigError("history", url, "expected s3://BUCKET/PREFIX")
    return parts.netloc, parts.path.strip("/")


# --- job ids and partition layouts --------------------------------------------------------------

_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"  # the alphabet of `jobq.ids`
_JOB_ID = re.compile(r"job_([0-9a-hjkmnp-tv-z]{26})", re.IGNORECASE)
_EARLIEST_ID_MS = 1_577_836_800_000  # 2020-01-01: an earlier "creation" means jobq did not mint the id


def job_created_ms(job_id: str, now_ms: int) -> int | None:
    """The creation time inside an id minted by `jobq.ids.new_job_id` (`job_` + 26 Crockford
    base32 characters, the first 48 bits milliseconds), or None for an id that is not one, or
    whose time is implausible (before 2020 or more than a day ahead): a custom id."""
    match = _JOB_ID.fullmatch(job_id)
    if match is None:
        return None
    value = 0
    for char in match.group(1).lower():
        value = value * 32 + _CROCKFORD.index(char)
    created_ms = value >> 80
    return created_ms if _EARLIEST_ID_MS <= created_ms <= now_ms + DAY_MS else None


@dataclass(frozen=True)
class PartitionLayout:
    """How keys under a prefix name their UTC hour: ``template`` formats an hour's key prefix and
    ``pattern`` reads the hour back from the start of a key (relative to the prefix)."""

    name: str
    template: str
    pattern: re.Pattern[str]

    def hour_prefix(self, hour_ms: int) -> str:
        return datetime.fromtimestamp(hour_ms // 1000, UTC).strftime(self.template)

    def hour_of(self, relative_key: str) -> int | None:
        match = self.pattern.match(relative_key)
        if match is None:
            return None
        year, month, day, hour = (int(g) for g in match.groups())
        return calendar.timegm((year, month, day, hour, 0, 0, 0, 0, 0)) * 1000


HIVE = PartitionLayout("hive", "dt=%Y-%m-%d/hour=%H/", re.compile(r"dt=(\d{4})-(\d{2})-(\d{2})/hour=(\d{2})/"))
# Firehose's default time prefix (UTC), used when its S3 destination has no custom prefix.
FIREHOSE = PartitionLayout("firehose", "%Y/%m/%d/%H/", re.compile(r"(\d{4})/(\d{2})/(\d{2})/(\d{2})/"))
LAYOUTS = {layout.name: layout for layout in (HIVE, FIREHOSE)}


def _root(prefix: str) -> str:
    prefix = prefix.strip("/")
    return f"{prefix}/" if prefix else ""


# --- reading -------------------------------------------------------------------------------------


class S3EventScanner:
    """Reads a job's events back from NDJSON (plain or gzip) objects under hour partitions.

    S3 has no index and `read` gets nothing but the job id, so it lists every object from a start
    hour onwards, in key order (which is hour order), downloads them and keeps the job's lines:

    - start: the job's creation hour when the id carries it (`job_created_ms`), else
      ``now - lookback_ms`` (events older than that are not found for custom ids); either way
      ``early_ms`` earlier still, for clock skew (and, over delivery-time layouts, for objects
      named after an earlier record of the same delivery);
    - stop: at the end of the listing, or on entering an hour that starts more than ``late_ms``
      after the ``limit``-th oldest event found. Over partitions by event time (`S3History`)
      ``late_ms`` is 0: a later hour holds only later events. Over delivery time (Firehose) it
      must cover how late an event can be delivered;
    - cost: one LIST per 1,000 objects and one GET per object, from the start hour on, all
      events of all jobs. A scan that would pass ``scan_bytes`` or ``scan_objects`` raises
      `StoreError` rather than run for minutes: at volume, query the partitions with Athena.

    Events come back oldest first by ``at_ms``; ties keep the order of keys and lines. Unreadable
    lines and objects are skipped and logged. Listing or download failures raise
    `StoreUnavailable` (retryable) or `StoreError`.
    """

    def __init__(
        self,
        client: Any,
        bucket: str,
        prefix: str = "",
        *,
        layout: PartitionLayout = HIVE,
        clock: Clock = SYSTEM_CLOCK,
        lookback_ms: int = 7 * DAY_MS,
        early_ms: int = CLOCK_SKEW_MS,
        late_ms: int = 0,
        scan_bytes: int = 256 * MiB,
        scan_objects: int = 2000,
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.root = _root(prefix)
        self.layout = layout
        self.clock = clock
        self.lookback_ms = lookback_ms
        self.early_ms = early_ms
        self.late_ms = late_ms
        self.scan_bytes = scan_bytes
        self.scan_objects = scan_objects

    @property
    def location(self) -> str:
        return f"s3://{self.bucket}/{self.root}"

    def start_ms(self, job_id: str) -> int:
        """The first hour (start, in ms) a read of `job_id` lists."""
        now_ms = self.clock.now_ms()
        created_ms = job_created_ms(job_id, now_ms)
        start_ms = (now_ms - self.lookback_ms if created_ms is None else created_ms) - self.early_ms
        return start_ms - start_ms % HOUR_MS

    def read(self, job_id: str, limit: int = 1000) -> list[RunEvent]:
        if limit <= 0:
            return []
        try:
            return self._scan(job_id, limit, self.start_ms(job_id))
        except JobqError:
            raise
        except Exception as exc:
            raise translate_aws_error(exc, f"reading history of {job_id!r} from {self.location}") from exc

    def _scan(self, job_id: str, limit: int, start_ms: int) -> list[RunEvent]:
        found: list[RunEvent] = []
        scanned_bytes = 0
        current_hour: int | None = None
        objects = self._objects(self.root + self.layout.hour_prefix(start_ms))
        for scanned_objects, (key, size, hour_ms) in enumerate(objects):
            if hour_ms != current_hour:
                current_hour = hour_ms
                if len(found) >= limit and hour_ms > self._kth_oldest_ms(found, limit) + self.late_ms:
                    break
            if scanned_bytes + size > self.scan_bytes or scanned_objects >= self.scan_objects:
                raise StoreError(
                    f"history of {job_id!r}: scanning {self.location} from {self.layout.hour_prefix(start_ms)} "
                    f"passed {scanned_objects} objects / {scanned_bytes} bytes (scan_objects={self.scan_objects}, "
                    f"scan_bytes={self.scan_bytes}) before reaching {key!r}; query these partitions with Athena "
                    "or raise the bounds"
                )
            scanned_bytes += size
            found.extend(self._events(key, job_id))
        found.sort(key=lambda e: e.at_ms)  # stable: equal times keep key and line order
        return found[:limit]

    @staticmethod
    def _kth_oldest_ms(found: list[RunEvent], k: int) -> int:
        return heapq.nsmallest(k, (e.at_ms for e in found))[-1]

    def _objects(self, start_after: str) -> Iterator[tuple[str, int, int]]:
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.root, StartAfter=start_after):
            for item in page.get("Contents", []):
                hour_ms = self.layout.hour_of(item["Key"][len(self.root) :])
                if hour_ms is not None:  # anything else under the prefix is not ours to read
                    yield item["Key"], int(item["Size"]), hour_ms

    def _events(self, key: str, job_id: str) -> list[RunEvent]:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        except Exception as exc:
            if aws_error_code(exc) == "NoSuchKey":
                return []  # expired (lifecycle) between the listing and now
            raise
        with contextlib.closing(body):
            data = body.read()
        try:
            if data.startswith(_GZIP_MAGIC):
                data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            log.warning("history object s3://%s/%s is not readable gzip (%s); skipped", self.bucket, key, exc)
            return []
        # A cheap test on the raw bytes skips most other jobs' lines before parsing; only ids
        # that JSON writes verbatim can be searched for that way.
        needle = job_id.encode() if job_id.isprintable() and '"' not in job_id and "\\" not in job_id else None
        events: list[RunEvent] = []
        unreadable = 0
        for line in data.splitlines():
            if not line.strip() or (needle is not None and needle not in line):
                continue
            try:
                event = RunEvent.model_validate_json(line)
            except ValueError:
                unreadable += 1
                continue
            if event.job_id == job_id:
                events.append(event)
        if unreadable:
            log.warning("history object s3://%s/%s: %d unreadable lines skipped", self.bucket, key, unreadable)
        return events


# --- the S3 sink ------------------------------------------------------------------------------------

_HOST = re.sub(r"[^A-Za-z0-9.]+", "_", socket.gethostname().split(".")[0])[:40] or "host"
_NONCE = secrets.token_hex(3)
_SEQ = itertools.count()
_SEQ_LOCK = threading.Lock()


def _next_seq() -> int:
    with _SEQ_LOCK:  # one counter for every sink in the process: two sinks never share a key
        return next(_SEQ)


class S3History(NdjsonSink):
    """`HistorySink` writing gzipped (or plain) NDJSON objects to S3; see the module docstring.

    Thread-safe. `read` flushes this sink first, then scans (`S3EventScanner`) and raises
    `StoreUnavailable`/`StoreError`; `record`, `flush` and `close` never raise.
    """

    def __init__(
        self,
        client: Any,
        bucket: str,
        prefix: str = "",
        *,
        flush_s: float = 60.0,
        flush_bytes: int = 5 * MiB,
        max_buffer_bytes: int = 64 * MiB,
        compression: str = "gzip",
        clock: Clock = SYSTEM_CLOCK,
        lookback_days: float = 7.0,
        scan_bytes: int = 256 * MiB,
        scan_objects: int = 2000,
        owns_client: bool = False,
    ) -> None:
        if compression not in ("gzip", "none"):
            raise ConfigError("compression", compression, "use gzip or none")
        self.client = client
        self.bucket = bucket
        self.root = _root(prefix)
        self.compression = compression
        self.clock = clock
        self.reader = S3EventScanner(
            client,
            bucket,
            prefix,
            layout=HIVE,
            clock=clock,
            lookback_ms=round(lookback_days * DAY_MS),
            scan_bytes=scan_bytes,
            scan_objects=scan_objects,
        )
        self._owns_client = owns_client
        self._conditional = True  # cleared if the store does not implement conditional writes
        super().__init__(name="s3", flush_s=flush_s, flush_bytes=flush_bytes, max_buffer_bytes=max_buffer_bytes)

    @classmethod
    def from_url(cls, url: str, *, clock: Clock = SYSTEM_CLOCK, **client_kwargs: Any) -> S3History:
        """``s3://BUCKET/PREFIX`` with options ``region``, ``endpoint`` (an S3-compatible store),
        ``aws_access_key_id`` and ``aws_secret_access_key`` (with ``endpoint`` only; else boto3's
        chain), ``flush_s`` (60), ``flush_bytes`` (5 MiB), ``max_buffer_bytes`` (64 MiB),
        ``compression`` (gzip|none), ``lookback_days`` (7: how far `read` looks for a custom job
        id), ``scan_bytes`` (256 MiB) and ``scan_objects`` (2000). `client_kwargs` go to
        `jobq.aws.aws_client`. Raises `ConfigError` naming a bad option, `MissingExtra` without boto3."""
        bucket, prefix = split_s3_url(url.split("?", 1)[0])
        options = UrlOptions(url, "history")
        aws = AwsOptions.read(options)
        settings: dict[str, Any] = {
            "flush_s": options.number("flush_s", 60.0, minimum=0.01),
            "flush_bytes": options.integer("flush_bytes", 5 * MiB, minimum=1),
            "max_buffer_bytes": options.integer("max_buffer_bytes", 64 * MiB, minimum=1),
            "compression": options.text("compression", "gzip"),
            "lookback_days": options.number("lookback_days", 7.0),
            "scan_bytes": options.integer("scan_bytes", 256 * MiB, minimum=1),
            "scan_objects": options.integer("scan_objects", 2000, minimum=1),
        }
        options.done()
        client = aws.client("s3", feature="the S3 history", scope="history", **client_kwargs)
        try:
            return cls(client, bucket, prefix, clock=clock, owns_client=True, **settings)
        except BaseException:
            client.close()
            raise

    def read(self, job_id: str, limit: int = 1000) -> list[RunEvent]:
        """The job's events, oldest first; this sink's buffer is flushed first so they are seen."""
        self.flush()
        return self.reader.read(job_id, limit)

    def key(self, hour_ms: int) -> str:
        """A new object key in the partition of `hour_ms`, unique to this process."""
        suffix = ".ndjson.gz" if self.compression == "gzip" else ".ndjson"
        name = f"{self.clock.now_ms():013d}-{_HOST}-{os.getpid()}-{_NONCE}-{_next_seq():08d}{suffix}"
        return self.root + HIVE.hour_prefix(hour_ms) + name

    def _ship(self, batch: list[Line]) -> list[Line]:
        by_hour: dict[int, list[Line]] = {}
        for line in batch:
            by_hour.setdefault(line.at_ms - line.at_ms % HOUR_MS, []).append(line)
        hours = sorted(by_hour)
        for done, hour_ms in enumerate(hours):
            try:
                self._put(hour_ms, by_hour[hour_ms])
            except Exception as exc:
                # Stop at the first failure: with the endpoint down, every further PUT would only
                # wait out the same timeouts.
                kept = [line for h in hours[done:] for line in by_hour[h]]
                log.warning(
                    "history upload to s3://%s/%s failed (%s: %s); %d events kept for the next flush",
                    self.bucket,
                    self.root,
                    type(exc).__name__,
                    exc,
                    len(kept),
                )
                return kept
        return []

    def _put(self, hour_ms: int, lines: list[Line]) -> None:
        body = b"".join(line.data for line in lines)
        if self.compression == "gzip":
            body = gzip.compress(body, compresslevel=6, mtime=0)  # 6: most of 9's ratio at a fraction of its CPU
        content_type = "application/gzip" if self.compression == "gzip" else "application/x-ndjson"
        for _ in range(3):
            condition = {"IfNoneMatch": "*"} if self._conditional else {}
            try:
                self.client.put_object(
                    Bucket=self.bucket, Key=self.key(hour_ms), Body=body, ContentType=content_type, **condition
                )
                return
            except Exception as exc:
                code = aws_error_code(exc)
                if code in _KEY_TAKEN:
                    continue  # never overwrite: take the next key
                if code == "NotImplemented" and self._conditional:
                    log.warning("s3://%s does not implement conditional writes; writing without them", self.bucket)
                    self._conditional = False
                    continue
                raise
        raise StoreError(f"s3://{self.bucket}/{self.root}: three fresh keys in a row already existed")

    def _release(self) -> None:
        if self._owns_client:
            self.client.close()
