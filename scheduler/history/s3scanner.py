"""Reading history back from NDJSON objects in S3, partitioned by UTC hour.

S3 has no index: `S3EventScanner` lists every object from a start hour onwards and keeps one
job's lines (its docstring gives the cost and the bounds). It reads what `S3History` writes
(``PREFIX/dt=YYYY-MM-DD/hour=HH/``, `HIVE`, by event time) and what a Firehose stream delivers
to S3 (``PREFIX/YYYY/MM/DD/HH/`` by default, `FIREHOSE`, by delivery time). A job id minted by
`jobq.ids` carries its creation time (`job_created_ms`), which is where a scan of it starts.
"""

from __future__ import annotations

import calendar
import contextlib
import gzip
import heapq
import logging
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from jobq.aws import aws_error_code, translate_aws_error
from jobq.clock import SYSTEM_CLOCK, Clock
from jobq.errors import ConfigError, JobqError, StoreError
from jobq.models import JobKey, RunEvent

log = logging.getLogger("jobq.history")

MiB = 1024 * 1024
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
# The clock that minted a job id and the clocks that time its events disagree by seconds, rarely
# minutes: scans start this much before the job's creation.
CLOCK_SKEW_MS = 5 * 60_000
_GZIP_MAGIC = b"\x1f\x8b"


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


# --- reading -----------------------------------------------------------------------------------


class S3EventScanner:
    """Reads a job's events back from NDJSON (plain or gzip) objects under hour partitions.

    S3 has no index and `read` gets nothing but the job's key, so it lists every object from a start
    hour onwards, in key order (which is hour order), downloads them and keeps the job's lines
    (those of its tenant and job id):

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

    def read(self, job: JobKey, limit: int = 1000) -> list[RunEvent]:
        if limit <= 0:
            return []
        try:
            return self._scan(job, limit, self.start_ms(job.job_id))
        except JobqError:
            raise
        except Exception as exc:
            raise translate_aws_error(exc, f"reading history of {str(job)!r} from {self.location}") from exc

    def _scan(self, job: JobKey, limit: int, start_ms: int) -> list[RunEvent]:
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
                    f"history of {str(job)!r}: scanning {self.location} from {self.layout.hour_prefix(start_ms)} "
                    f"passed {scanned_objects} objects / {scanned_bytes} bytes (scan_objects={self.scan_objects}, "
                    f"scan_bytes={self.scan_bytes}) before reaching {key!r}; query these partitions with Athena "
                    "or raise the bounds"
                )
            scanned_bytes += size
            found.extend(self._events(key, job))
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

    def _events(self, key: str, job: JobKey) -> list[RunEvent]:
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
        job_id = job.job_id
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
            if event.job_key == job:
                events.append(event)
        if unreadable:
            log.warning("history object s3://%s/%s: %d unreadable lines skipped", self.bucket, key, unreadable)
        return events
