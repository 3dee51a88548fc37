"""DynamoDB plumbing for the DynamoDB store: the URL, the table client and error translation.

URL: ``dynamodb://TABLE?region=us-east-1&endpoint=http://127.0.0.1:8000``

=========================  =========================================================================
``TABLE``                  the table name, case kept (DynamoDB names are case-sensitive)
``region``, ``endpoint``,  as in every AWS URL (`jobq.aws`): the region, else the AWS chain; a local
``aws_access_key_id``,     DynamoDB (moto, DynamoDB Local, LocalStack), absent for AWS itself; and
``aws_secret_access_key``  credentials for that local endpoint only (against AWS, boto3's chain)
``threads``                parallel calls per store (default 32): conditional writes of a batch,
                           shard queries, batch reads. botocore's connection pool is sized to match
``connect_timeout_s``,     botocore's socket timeouts (defaults 2 and 10)
``read_timeout_s``
``max_attempts``           botocore's "standard" retry mode, first try included (default 4): it
                           retries throttling, 5xx and connection errors with jittered backoff
=========================  =========================================================================

Errors: every botocore exception is translated here, through `jobq.aws.translate_aws_error`.
Throttling, 5xx, a contended transaction and connection failures become `StoreUnavailable`
(retryable); a missing table becomes a `StoreError` naming ``jobq init``; a failed condition
becomes `ConditionFailed` and a cancelled transaction `TransactionCancelled`, which the store turns
into its documented outcomes (None, `Conflict`, `DuplicateJob`, ...).

The table itself (keys, indexes, TTL, and its CloudFormation and Terraform renderings) is
`jobq.dynamodb_schema`; `render_definition` and `table_definition` are re-exported here.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

from jobq.aws import AwsOptions, UrlOptions, aws_error_code, require_aws, translate_aws_error
from jobq.dynamodb_schema import GSIS, TTL_ATTRIBUTE, render_definition, table_definition
from jobq.errors import ConfigError, Conflict, JobqError, StoreError, StoreUnavailable

__all__ = [
    "BATCH_GET_KEYS",
    "SHARDS",
    "TRANSACT_ITEMS",
    "TTL_ATTRIBUTE",
    "ConditionFailed",
    "DynamoCallError",
    "DynamoConfig",
    "DynamoTable",
    "Expr",
    "Item",
    "TransactionCancelled",
    "backoff",
    "render_definition",
    "table_definition",
]

T = TypeVar("T")
R = TypeVar("R")

#: A DynamoDB item in the low-level wire form: ``{"PK": {"S": "JOB#..."}, "fence": {"N": "3"}}``.
Item = dict[str, Any]

SHARDS = 16  # fixed: it is part of the keys, so changing it needs a migration of every leased run
BATCH_GET_KEYS = 100  # BatchGetItem's limit per call
TRANSACT_ITEMS = 100  # TransactWriteItems' limit per call

# Transient on top of `jobq.aws`'s throttling and 5xx codes: another transaction holding one of
# the items for a moment.
_CONTENTION = frozenset({"TransactionConflictException", "TransactionInProgressException"})
# Cancellation reasons (per item of a transaction) carry their own codes, without "Exception".
_CONTENDED = frozenset(
    {"TransactionConflict", "ProvisionedThroughputExceeded", "ThrottlingError", "RequestLimitExceeded"}
)
_THREADS = 32
_CONNECT_TIMEOUT_S = 2.0
_READ_TIMEOUT_S = 10.0
_MAX_ATTEMPTS = 4
_TABLE_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


class DynamoCallError(StoreError):
    """A DynamoDB call failed for a reason that trying again will not fix; `code` is AWS's error code."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class ConditionFailed(Conflict):
    """A conditional write's condition was false. `item` is the item as stored, when the request
    asked for it (``ReturnValuesOnConditionCheckFailure=ALL_OLD``) and it exists."""

    def __init__(self, item: Item | None) -> None:
        super().__init__("DynamoDB condition failed")
        self.item = item


class TransactionCancelled(Conflict):
    """A TransactWriteItems was cancelled; `codes[i]` is why item i failed (``"None"`` when it did
    not) and `items[i]` the stored item for a failed condition that asked for it."""

    def __init__(self, reasons: Sequence[Mapping[str, Any]]) -> None:
        self.codes = [str(r.get("Code") or "None") for r in reasons]
        self.items: list[Item | None] = [r.get("Item") for r in reasons]
        super().__init__(f"DynamoDB transaction cancelled: {self.codes}")

    @property
    def contended(self) -> bool:
        """Another transaction or a throttle got in the way: the same request may succeed later."""
        return not _CONTENDED.isdisjoint(self.codes)

    @property
    def condition_failed(self) -> bool:
        return "ConditionalCheckFailed" in self.codes

    def unexpected(self, doing: str) -> StoreError:
        """The error to raise when neither a failed condition nor contention explains it."""
        if self.contended:
            return StoreUnavailable(f"{doing}: DynamoDB transaction contended, try again ({self.codes})")
        return StoreError(f"{doing}: DynamoDB transaction cancelled ({self.codes})")


@dataclass(frozen=True, slots=True)
class DynamoConfig:
    table: str
    aws: AwsOptions = field(default_factory=AwsOptions)
    threads: int = _THREADS
    connect_timeout_s: float = _CONNECT_TIMEOUT_S
    read_timeout_s: float = _READ_TIMEOUT_S
    max_attempts: int = _MAX_ATTEMPTS

    @classmethod
    def from_url(cls, url: str) -> DynamoConfig:
        """Parse a ``dynamodb://`` URL (see the module docstring); raises `ConfigError` naming the bad key."""
        parts = urlsplit(url)
        if parts.scheme.lower() != "dynamodb":
            raise ConfigError("store", url, "a DynamoDB URL starts with dynamodb://")
        table = parts.netloc  # not .hostname, which lower-cases the name
        if not 3 <= len(table) <= 255 or not set(table) <= _TABLE_NAME_CHARS:
            raise ConfigError("store", table, "a DynamoDB table name is 3-255 characters of a-z A-Z 0-9 _ . -")
        options = UrlOptions(url, "store")
        config = cls(
            table=table,
            aws=AwsOptions.read(options),
            threads=options.integer("threads", _THREADS, minimum=1, maximum=256),
            connect_timeout_s=options.number("connect_timeout_s", _CONNECT_TIMEOUT_S, minimum=0.01, maximum=300),
            read_timeout_s=options.number("read_timeout_s", _READ_TIMEOUT_S, minimum=0.01, maximum=300),
            max_attempts=options.integer("max_attempts", _MAX_ATTEMPTS, minimum=1, maximum=20),
        )
        options.done()
        return config


class DynamoTable:
    """One table through one boto3 client and one thread pool: translated calls, paged queries,
    batch reads and a parallel map. Thread-safe (boto3 clients are)."""

    def __init__(self, config: DynamoConfig) -> None:
        self.config = config
        self.name = config.table
        self.client: Any = config.aws.client(
            "dynamodb",
            feature="the DynamoDB store",
            scope="store",
            connect_timeout_s=config.connect_timeout_s,
            read_timeout_s=config.read_timeout_s,
            max_attempts=config.max_attempts,
            max_pool_connections=config.threads,  # one connection per thread of the pool
        )
        self._errors = require_aws("botocore.exceptions", "the DynamoDB store")
        self._pool = ThreadPoolExecutor(max_workers=config.threads, thread_name_prefix="jobq-dynamodb")
        self._closed = threading.Event()

    # -- calls -----------------------------------------------------------------------------------

    def call(self, operation: str, **kwargs: Any) -> dict[str, Any]:
        """`client.<operation>(**kwargs)` with every botocore exception translated (module docstring)."""
        try:
            response: dict[str, Any] = getattr(self.client, operation)(**kwargs)
        except (self._errors.ClientError, self._errors.BotoCoreError) as exc:
            raise self._translate(operation, exc) from exc
        return response

    def _translate(self, operation: str, exc: Exception) -> JobqError:
        code = aws_error_code(exc)
        if code == "ConditionalCheckFailedException":
            return ConditionFailed(getattr(exc, "response", {}).get("Item"))
        if code == "TransactionCanceledException":
            return TransactionCancelled(getattr(exc, "response", {}).get("CancellationReasons") or [])
        if code == "ResourceNotFoundException":
            return DynamoCallError(
                f"DynamoDB table {self.name!r} not found ({self._where()}): create it with `jobq init`", code
            )
        error = translate_aws_error(exc, f"DynamoDB {operation}", where=self._where(), transient=_CONTENTION)
        # The code travels with errors that trying again will not fix: `create` tells an existing
        # table (ResourceInUseException) from the rest by it.
        return DynamoCallError(str(error), code) if code is not None and not error.retryable else error

    def _where(self) -> str:
        region = self.client.meta.region_name
        endpoint = self.config.aws.endpoint
        return f"endpoint {endpoint}, region {region}" if endpoint else f"region {region}"

    def parallel(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """`[fn(i) for i in items]` on the pool, results in input order. Waits for every call, then
        raises the first error. Never call it from inside `fn` (the pool could starve itself)."""
        if len(items) <= 1:
            return [fn(i) for i in items]
        futures = [self._pool.submit(fn, i) for i in items]
        wait(futures)
        for future in futures:
            error = future.exception()
            if error is not None:
                raise error
        return [f.result() for f in futures]

    # -- reads -----------------------------------------------------------------------------------

    def query(
        self, limit: int | None, keep: Callable[[Item], bool] | None = None, **kwargs: Any
    ) -> Iterator[list[Item]]:
        """Pages of a Query (or a Scan when ``Segment`` is given) whose items pass `keep`, stopping
        once `limit` items have been yielded (all of them when None). Unfiltered queries ask for
        exactly what is left, so a bounded read reads no more than it returns."""
        operation = "scan" if "Segment" in kwargs else "query"
        filtered = keep is not None or "FilterExpression" in kwargs
        found = 0
        start: Item | None = None
        while limit is None or found < limit:
            request = {"TableName": self.name, **kwargs}
            if limit is not None:
                # A filter is applied after Limit counts items: read a page worth the round trip.
                request["Limit"] = max(limit - found, 100) if filtered else limit - found
            if start is not None:
                request["ExclusiveStartKey"] = start
            response = self.call(operation, **request)
            items = [i for i in response.get("Items", []) if keep is None or keep(i)]
            if limit is not None:
                items = items[: limit - found]
            found += len(items)
            yield items
            start = response.get("LastEvaluatedKey")
            if start is None:
                return

    def query_all(self, limit: int | None, keep: Callable[[Item], bool] | None = None, **kwargs: Any) -> list[Item]:
        return [item for page in self.query(limit, keep, **kwargs) for item in page]

    def batch_get(self, keys: Sequence[Item], projection: str | None = None) -> list[Item]:
        """Strongly consistent BatchGetItem of `keys` (deduplicated), 100 per call and the calls in
        parallel; unprocessed keys are retried with backoff. Missing items are simply absent."""
        unique = list({_key_id(k): k for k in keys}.values())
        chunks = [unique[i : i + BATCH_GET_KEYS] for i in range(0, len(unique), BATCH_GET_KEYS)]
        return [item for chunk in self.parallel(lambda c: self._batch_get(c, projection), chunks) for item in chunk]

    def _batch_get(self, keys: list[Item], projection: str | None) -> list[Item]:
        found: list[Item] = []
        request: dict[str, Any] = {"Keys": keys, "ConsistentRead": True}
        if projection is not None:
            request["ProjectionExpression"] = projection
        for attempt in range(10):
            response = self.call("batch_get_item", RequestItems={self.name: request})
            found.extend(response.get("Responses", {}).get(self.name, []))
            pending = response.get("UnprocessedKeys", {}).get(self.name)
            if not pending:
                return found
            request = pending  # DynamoDB hands back the request with only the keys left
            backoff(attempt)
        raise StoreUnavailable(f"DynamoDB batch_get_item: keys still unprocessed after 10 tries on {self.name!r}")

    # -- the table -------------------------------------------------------------------------------

    def create(self, wait_s: float = 300.0) -> bool:
        """Create the table and its indexes (on-demand capacity) and wait until it is ACTIVE; enable
        TTL on ``ttl`` (expired idempotency keys). Returns False when the table existed: then only
        its indexes are checked, and a missing one raises `StoreError`."""
        created = True
        try:
            self.call("create_table", **table_definition(self.name))
        except DynamoCallError as exc:
            if exc.code != "ResourceInUseException":
                raise
            created = False
        deadline = time.monotonic() + wait_s
        while True:
            table = self.call("describe_table", TableName=self.name)["Table"]
            indexes = table.get("GlobalSecondaryIndexes", [])
            if table["TableStatus"] == "ACTIVE" and all(i.get("IndexStatus") == "ACTIVE" for i in indexes):
                break
            if time.monotonic() > deadline:
                raise StoreUnavailable(f"DynamoDB table {self.name!r} not ACTIVE after {wait_s:.0f} s")
            time.sleep(1.0)
        missing = sorted({i["IndexName"] for i in GSIS} - {i["IndexName"] for i in indexes})
        if missing:
            raise StoreError(
                f"DynamoDB table {self.name!r} exists without the indexes {missing}: it was not created by "
                "`jobq init`; add them (see `jobq init --print`) or use another table name"
            )
        ttl = self.call("describe_time_to_live", TableName=self.name)["TimeToLiveDescription"]
        if ttl.get("TimeToLiveStatus") not in ("ENABLED", "ENABLING"):
            spec = {"Enabled": True, "AttributeName": TTL_ATTRIBUTE}
            self.call("update_time_to_live", TableName=self.name, TimeToLiveSpecification=spec)
        return created

    def delete(self) -> None:
        """Delete the table (tests and teardown). Missing tables are ignored."""
        try:
            self.call("delete_table", TableName=self.name)
        except DynamoCallError as exc:
            if exc.code != "ResourceNotFoundException":
                raise

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._pool.shutdown(wait=True)
            self.client.close()


class Expr:
    """Builds the expressions of one request (update, condition, filter) with every attribute name
    aliased, since DynamoDB reserves hundreds of words (state, name, status, key, result, ...).
    Values are wire-form attribute values (``{"S": ...}``); `set` with None removes."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.values: dict[str, Any] = {}
        self.sets: list[str] = []
        self.removes: list[str] = []
        self.conditions: list[str] = []

    def n(self, attribute: str) -> str:
        self.names[f"#{attribute}"] = attribute
        return f"#{attribute}"

    def v(self, value: dict[str, Any]) -> str:
        alias = f":v{len(self.values)}"
        self.values[alias] = value
        return alias

    def set(self, attribute: str, value: dict[str, Any] | None) -> None:
        if value is None:
            self.removes.append(self.n(attribute))
        else:
            self.sets.append(f"{self.n(attribute)} = {self.v(value)}")

    def copy(self, attribute: str, source: str) -> None:
        self.sets.append(f"{self.n(attribute)} = {self.n(source)}")

    def add(self, attribute: str) -> None:
        self.sets.append(f"{self.n(attribute)} = {self.n(attribute)} + {self.v({'N': '1'})}")

    def when(self, attribute: str, op: str, value: dict[str, Any]) -> None:
        self.conditions.append(f"{self.n(attribute)} {op} {self.v(value)}")

    def when_in(self, attribute: str, values: Iterable[str]) -> None:
        aliases = ", ".join(self.v({"S": v}) for v in sorted(values))
        self.conditions.append(f"{self.n(attribute)} IN ({aliases})")

    def take_filter(self) -> dict[str, str]:
        """The conditions so far as a ``FilterExpression`` argument (empty when none), cleared."""
        filters, self.conditions = self.conditions, []
        return {"FilterExpression": " AND ".join(filters)} if filters else {}

    def update(self, **request: Any) -> dict[str, Any]:
        """An UpdateItem request: `request` plus the expressions built so far."""
        parts = []
        if self.sets:
            parts.append("SET " + ", ".join(self.sets))
        if self.removes:
            parts.append("REMOVE " + ", ".join(self.removes))
        request["UpdateExpression"] = " ".join(parts)
        return self.finish(**request)

    def finish(self, **request: Any) -> dict[str, Any]:
        if self.conditions:
            request["ConditionExpression"] = " AND ".join(self.conditions)
        if self.names:
            request["ExpressionAttributeNames"] = self.names
        if self.values:
            request["ExpressionAttributeValues"] = self.values
        return request


def backoff(attempt: int) -> None:
    """Full-jitter sleep before retry `attempt` (0-based): up to 25 ms doubling to 1 s."""
    time.sleep(random.uniform(0, min(1.0, 0.025 * 2**attempt)))


def _key_id(key: Item) -> tuple[str, str]:
    return key["PK"]["S"], key["SK"]["S"]
