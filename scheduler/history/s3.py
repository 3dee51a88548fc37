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
a start hour onwards and filters lines by job id (``S3EventScanner``, `jobq.history.s3scanner`).
It suits development and small deployments; at production volume the query path is Athena (or
Glue, Trino, Spark) over the same partitions, and ``read`` refuses scans beyond
``scan_bytes``/``scan_objects``.
"""

from __future__ import annotations

import gzip
import itertools
import logging
import os
import re
import secrets
import socket
import threading
from typing import Any

from jobq.aws import AwsOptions, UrlOptions, aws_error_code
from jobq.clock import SYSTEM_CLOCK, Clock
from jobq.errors import ConfigError, StoreError
from jobq.history.buffered import Line, NdjsonSink
from jobq.history.s3scanner import DAY_MS, HIVE, HOUR_MS, MiB, S3EventScanner, split_s3_url
from jobq.models import JobKey, RunEvent

log = logging.getLogger("jobq.history")

# A conditional PUT lost to an object (or a concurrent write) under the same key.
_KEY_TAKEN = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})

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
            raise ConfigError("history.compression", compression, "use gzip or none")
        self.client = client
        self.bucket = bucket
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
        self.root = self.reader.root  # the prefix as a key prefix: "" or ending in "/"
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

    def read(self, job: JobKey, limit: int = 1000) -> list[RunEvent]:
        """The job's events, oldest first; this sink's buffer is flushed first so they are seen."""
        self.flush()
        return self.reader.read(job, limit)

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
