"""The DynamoDB store: jobs, runs, idempotency keys, workers, tokens and secrets in one table.

The item and index design is drawn in docs/dynamodb.md and encoded in `jobq.store.dynamodb_items`;
the URL, the table client and error translation live in `jobq.dynamodb`, the table's definition in
`jobq.dynamodb_schema`.

Every state change is one ``UpdateItem`` whose ``ConditionExpression`` names the expected states,
fence, lease owner and version, returning the new item; a batch runs them concurrently (one run's
transitions in order). A job's creation, its first runs and its idempotency key are one
``TransactWriteItems``. GSI queries are eventually consistent (DynamoDB offers nothing else); every
other read is strongly consistent.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Literal

from jobq.dynamodb import (
    SHARDS,
    TRANSACT_ITEMS,
    ConditionFailed,
    DynamoConfig,
    DynamoTable,
    Expr,
    Item,
    TransactionCancelled,
    backoff,
)
from jobq.dynamodb_schema import render_definition, table_definition
from jobq.errors import Conflict, DuplicateJob, IdempotencyConflict, JobNotFound, JobqError, StoreUnavailable
from jobq.joblist import parse_job_cursor
from jobq.models import (
    LEASED_STATES,
    PRIORITIES_BY_RANK,
    TERMINAL_STATES,
    ApiToken,
    IdempotencyRecord,
    Job,
    JobKey,
    JobStatus,
    Run,
    RunState,
    TaskInfo,
    Transition,
)
from jobq.ports import CreateRequest, CreateResult, JobQuery, Page, RunQuery
from jobq.records import decode_tasks
from jobq.registry import Census, DaemonRecord
from jobq.store import dynamodb_census
from jobq.store.dynamodb_items import (
    TASKS_PK,
    TOKENS_PK,
    WORKERS_PK,
    as_n,
    as_s,
    field_value,
    flat_item,
    flat_record,
    gsi1,
    idempotency_item,
    idempotency_pk,
    job_from_item,
    job_item,
    job_item_key,
    job_pk,
    plan_gsi1,
    plan_gsi2,
    run_from_item,
    run_item,
    run_key,
    shard_of,
    tenant_segment,
    token_hash_key,
)
from jobq.store.memory import job_cursor, parse_run_cursor, refuse_corrupt, run_cursor

_FINISHABLE = (JobStatus.ACTIVE.value, JobStatus.COMPLETED.value)
_CREATE_ATTEMPTS = 8  # contention (TransactionConflict) backs off between attempts


def _in_order(runs: Iterable[Run]) -> list[Run]:
    return sorted(runs, key=lambda r: (r.priority.rank, r.due_ms, r.run_id))


class DynamoStore:
    """`JobStore` and `TenantStore` on one DynamoDB table (module docstring, docs/dynamodb.md)."""

    #: How many of the 16 shards the census reads (`jobq.store.dynamodb_census`): 4 reads a quarter.
    census_shards = 4
    #: Submission groups writing at once: each request is its own transaction, sent in parallel.
    concurrent_groups = 4

    def __init__(self, table: DynamoTable) -> None:
        self.table = table

    @classmethod
    def from_url(cls, url: str) -> DynamoStore:
        """``dynamodb://TABLE?region=...&endpoint=...`` (parameters in `jobq.dynamodb`). Makes no
        call: a missing table shows up on first use as a `StoreError` naming `jobq init`."""
        return cls(DynamoTable(DynamoConfig.from_url(url)))

    # -- the table -----------------------------------------------------------------------------

    def create_table(self) -> bool:
        """Create the table and its indexes and wait until ACTIVE (what `jobq init` runs).
        Idempotent: returns False when it existed (its indexes are checked)."""
        return self.table.create()

    def delete_table(self) -> None:
        self.table.delete()

    def table_definition(self) -> dict[str, Any]:
        """The CreateTable request `create_table` sends."""
        return table_definition(self.table.name)

    def render_definition(self, fmt: Literal["cloudformation", "terraform"]) -> str:
        """The table as a CloudFormation template (JSON) or a Terraform resource (`jobq init --print`)."""
        return render_definition(self.table.name, fmt)

    # -- jobs ----------------------------------------------------------------------------------

    def create_job_group(self, requests: Sequence[CreateRequest]) -> list[CreateResult | JobqError]:
        """Each request through `create_job`, in parallel: every one is its own TransactWriteItems.

        One transaction for the group would not do: DynamoDB cancels a whole transaction when one
        condition fails, so one duplicate would fail every caller, and it holds at most 100 items.
        The requests of a group were all in flight at once, so any order among them is one a
        serial caller could have seen; two with one Idempotency-Key meet in `create_job`'s
        contention handling, and exactly one creates the job. A failure (also `StoreUnavailable`)
        is that request's alone."""

        def one(request: CreateRequest) -> CreateResult | JobqError:
            try:
                return self.create_job(request.job, request.runs, request.idempotency)
            except JobqError as exc:
                return exc

        return self.table.parallel(one, list(requests))

    def create_jobs(self, items: Sequence[tuple[Job, Sequence[Run]]]) -> list[bool]:
        """Each job through `create_job`, in parallel: every one is its own transaction."""

        def one(item: tuple[Job, Sequence[Run]]) -> bool:
            try:
                return self.create_job(item[0], item[1]).created
            except DuplicateJob:
                return False

        return self.table.parallel(one, list(items))

    def create_job(self, job: Job, runs: Sequence[Run], idempotency: IdempotencyRecord | None = None) -> CreateResult:
        """One TransactWriteItems: the job (if absent), its first 98 runs (each if absent) and the
        idempotency key (if absent or expired). Runs beyond what a transaction holds are added
        right after it; a crash in between leaves them to be created again by nobody, so callers
        keep first batches small (one-offs have one run)."""
        first = list({r.run_id: r for r in reversed(runs)}.values())[::-1]
        head, tail = first[: TRANSACT_ITEMS - 2], first[TRANSACT_ITEMS - 2 :]
        existing: set[str] = set()
        orphan: str | None = None  # a key whose job no longer exists may be taken over
        for attempt in range(_CREATE_ATTEMPTS):
            batch = [r for r in head if r.run_id not in existing]
            items = [self._put_if_absent(job_item(job))] + [self._put_if_absent(run_item(r)) for r in batch]
            if idempotency is not None:
                items.append(self._put_idempotency(idempotency, orphan))
            try:
                # A token per attempt: botocore's retries of one attempt are then idempotent.
                self.table.call("transact_write_items", TransactItems=items, ClientRequestToken=uuid.uuid4().hex)
            except TransactionCancelled as exc:
                if len(exc.codes) != len(items):
                    raise exc.unexpected(f"creating job {job.job_id!r}") from None
                if exc.contended:  # a concurrent creation with the same key: its outcome decides ours
                    backoff(attempt)
                    continue
                failed = [c == "ConditionalCheckFailed" for c in exc.codes]
                if idempotency is not None and failed[-1]:
                    stored = exc.items[-1] or self._get(idempotency_pk(idempotency.tenant_id, idempotency.key), "IDEM")
                    if stored is not None:
                        record = flat_record(IdempotencyRecord, stored)
                        if record.fingerprint != idempotency.fingerprint:
                            raise IdempotencyConflict(idempotency.key) from None
                        original = self._get(job_pk(record.job_key), "META")
                        if original is not None:
                            return CreateResult(job_from_item(original), created=False, response=record.response)
                        orphan = record.job_id
                    continue
                if failed[0]:
                    raise DuplicateJob(job.job_id) from None
                if not any(failed):
                    raise exc.unexpected(f"creating job {job.job_id!r}") from None
                existing.update(r.run_id for r, lost in zip(batch, failed[1:], strict=False) if lost)
                continue
            if tail:
                self.add_runs(tail)
            return CreateResult(job, created=True)
        raise StoreUnavailable(f"creating job {job.job_id!r}: still contended after {_CREATE_ATTEMPTS} attempts")

    def _put_if_absent(self, item: Item) -> dict[str, Any]:
        return {"Put": {"TableName": self.table.name, "Item": item, "ConditionExpression": "attribute_not_exists(PK)"}}

    def _put_idempotency(self, record: IdempotencyRecord, orphan: str | None) -> dict[str, Any]:
        e = Expr()
        taken = f"attribute_not_exists(PK) OR {e.n('expires_ms')} <= {e.v(as_n(record.created_ms))}"
        if orphan is not None:
            taken += f" OR {e.n('job_id')} = {e.v(as_s(orphan))}"
        e.conditions.append(f"({taken})")
        put = e.finish(TableName=self.table.name, Item=idempotency_item(record))
        put["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        return {"Put": put}

    def get_jobs(self, keys: Sequence[JobKey]) -> dict[JobKey, Job]:
        jobs = (job_from_item(i) for i in self.table.batch_get([job_item_key(k) for k in keys]))
        return {j.key: j for j in jobs}

    def list_jobs(self, query: JobQuery) -> Page[Job]:
        """Ordered by job id (then tenant; both descending with `newest_first`) through GSI3
        (``JOBS#<tenant>#<shard>``, sorted by id): with a tenant, 16 shard queries from the cursor,
        merged; then one batch read of the page's documents. Without a tenant there is no partition
        to query, so GSI3 is scanned (16 segments in parallel) and the first keys kept: that costs a
        read of every job's index entry."""
        e = Expr()
        if query.status is not None:
            e.when("status", "=", as_s(query.status.value))
        if query.priority is not None:
            e.when("priority", "=", as_n(query.priority.rank))
        if query.name_prefix:
            e.conditions.append(f"begins_with({e.n('name')}, {e.v(as_s(query.name_prefix))})")
        want = query.limit + 1
        after = parse_job_cursor(query.cursor) if query.cursor else None

        newest = query.newest_first

        def beyond(key: tuple[str, str]) -> bool:  # (job id, tenant) after the cursor, in listing order
            if after is None:
                return True
            if after[1] is None:
                return key[0] < after[0] if newest else key[0] > after[0]
            return key < (after[0], after[1]) if newest else key > (after[0], after[1])

        if query.tenant_id is not None:
            partitions = [f"JOBS#{tenant_segment(query.tenant_id)}#{n}" for n in range(SHARDS)]
            prefix = query.id_prefix
            if prefix and (after is None or (not newest and after[0] < prefix) or (newest and after[0] > prefix + "~")):
                entries = self._gsi_shards("GSI3", partitions, want + 1, "begins_with", as_s(prefix), e, newest=newest)
            elif prefix and after is not None and (after[0] < prefix if newest else after[0] > prefix + "~"):
                entries = []  # the cursor is past every id with the prefix
            elif prefix and after is not None:
                # Job ids are ASCII below `~`: every id with the prefix sorts before prefix + "~".
                low, high = (prefix, after[0]) if newest else (after[0], prefix + "~")
                entries = self._gsi_shards(
                    "GSI3", partitions, want + 1, "BETWEEN", (as_s(low), as_s(high)), e, newest=newest
                )
            else:
                bound = as_s(after[0]) if after is not None else None
                entries = self._gsi_shards(
                    "GSI3", partitions, want + 1, "<=" if newest else ">=", bound, e, newest=newest
                )
        else:
            if query.id_prefix:
                e.conditions.append(f"begins_with({e.n('GSI3SK')}, {e.v(as_s(query.id_prefix))})")
            if after is not None:
                e.when("GSI3SK", "<=" if newest else ">=", as_s(after[0]))
            filters = e.take_filter()
            projection = f"{e.n('GSI3SK')}, {e.n('tenant_id')}"
            scan = e.finish(IndexName="GSI3", ProjectionExpression=projection, TotalSegments=SHARDS, **filters)
            segments = self.table.parallel(lambda s: self.table.query_all(None, Segment=s, **scan), list(range(SHARDS)))
            entries = [i for rows in segments for i in rows]
        found = sorted({(i["GSI3SK"]["S"], i["tenant_id"]["S"]) for i in entries}, reverse=newest)
        keys = [k for k in found if beyond(k)][:want]
        page = [JobKey(tenant, job_id) for job_id, tenant in keys[: query.limit]]
        jobs = self.get_jobs(page)
        items = [jobs[k] for k in page if k in jobs]
        return Page(items, job_cursor(items[-1]) if len(keys) > query.limit and items else None)

    def update_job(self, job: Job) -> Job:
        """A PutItem conditional on the stored version; the failed condition's item tells a
        missing job (`JobNotFound`) from a moved one (`Conflict`) without a second read."""
        refuse_corrupt(job)
        stored = job.model_copy(update={"version": job.version + 1})
        e = Expr()
        e.when("version", "=", as_n(job.version))
        request = e.finish(TableName=self.table.name, Item=job_item(stored))
        try:
            self.table.call("put_item", ReturnValuesOnConditionCheckFailure="ALL_OLD", **request)
        except ConditionFailed as exc:
            if exc.item is None:
                raise JobNotFound(str(job.key)) from None
            found = exc.item["version"]["N"]
            raise Conflict(f"job {str(job.key)!r} changed (version {found}, expected {job.version})") from None
        return stored

    def set_job_status(
        self, key: JobKey, status: JobStatus, expect: frozenset[JobStatus], now_ms: int, reason: str | None = None
    ) -> bool:
        """One conditional UpdateItem of the job's `status`, `status_reason`, `version` and
        `updated_ms` attributes (authoritative over its document, which is not rewritten) and GSI2's
        partition key."""
        if not expect:
            return False
        e = Expr()
        e.set("status", as_s(status.value))
        e.set("status_reason", None if reason is None else as_s(reason))
        e.add("version")
        e.set("updated_ms", as_n(now_ms))
        e.set("GSI2PK", as_s(f"DUE#{shard_of(key.job_id)}") if status is JobStatus.ACTIVE else None)
        e.when_in("status", sorted(s.value for s in expect))
        try:
            self.table.call("update_item", **e.update(TableName=self.table.name, Key=job_item_key(key)))
        except ConditionFailed:  # absent, or another status
            return False
        return True

    def due_jobs(self, before_ms: int, limit: int, shards: Collection[int] | None = None) -> list[Job]:
        """One GSI2 query per shard (``DUE#<shard>``, ``GSI2SK <= before_ms``) in parallel, merged
        CRITICAL first. GSI2 is sorted by fire time alone, so the tier order holds among the `limit`
        earliest jobs of each shard: a LOW backlog deeper than that can still hide a CRITICAL job
        (docs/scheduling.md)."""
        if limit <= 0:
            return []
        wanted = range(SHARDS) if shards is None else sorted(set(shards))
        if not wanted:
            return []
        items = self._gsi_shards("GSI2", [f"DUE#{n}" for n in wanted], limit, "<=", as_n(before_ms))
        jobs = sorted((job_from_item(i) for i in items), key=lambda j: (j.priority.rank, j.next_fire_ms or 0, j.job_id))
        return jobs[:limit]

    def advance_jobs(self, items: Sequence[tuple[Job, Sequence[Run]]]) -> list[bool]:
        """The runs first (conditional puts, concurrently), then each job's conditional put,
        concurrently: DynamoDB has no conditional batch write, and a transaction of up to 100 items
        fails as a whole when one condition fails."""
        self.add_runs([run for job, runs in items if job.corrupt is None for run in runs])

        def advance(job: Job) -> bool:
            if job.corrupt is not None:
                return False
            try:
                self.update_job(job)
            except (Conflict, JobNotFound):
                return False
            return True

        return self.table.parallel(advance, [job for job, _ in items])

    # -- runs ----------------------------------------------------------------------------------

    def add_runs(self, runs: Sequence[Run]) -> list[Run]:
        """A conditional PutItem per run (``attribute_not_exists``), concurrently. Not a batch
        write: BatchWriteItem cannot be conditional, and a transaction costs twice the writes."""
        first = list({r.run_id: r for r in reversed(runs)}.values())[::-1]

        def put(run: Run) -> Run | None:
            try:
                self.table.call("put_item", **self._put_if_absent(run_item(run))["Put"])
            except ConditionFailed:
                return None
            return run

        return [r for r in self.table.parallel(put, first) if r is not None]

    def get_runs(self, run_ids: Sequence[str]) -> dict[str, Run]:
        keys = [k for k in map(run_key, run_ids) if k is not None]
        runs = (run_from_item(i) for i in self.table.batch_get(keys))
        wanted = set(run_ids)
        return {r.run_id: r for r in runs if r.run_id in wanted}

    def list_runs(self, query: RunQuery) -> Page[Run]:
        """Newest nominal time first. With a job id: one Query of the job's partition (runs sort by
        nominal time there). Dead letters: 16 GSI1 queries (``DEAD#<shard>``, by nominal time,
        descending) merged. Anything else has no index: a parallel Scan of the table, keeping the
        newest matches, which reads every item."""
        e = Expr()
        if query.tenant_id is not None and query.job is None:
            e.when("tenant_id", "=", as_s(query.tenant_id))
        if query.states:
            e.when_in("state", [s.value for s in query.states])
        if query.dead_letter is not None:
            e.when("dead_letter", "=", {"BOOL": query.dead_letter})
        after = parse_run_cursor(query.cursor) if query.cursor else None
        want = query.limit + 1

        def before_cursor(item: Item) -> bool:
            return after is None or (int(item["nominal_ms"]["N"]), item["run_id"]["S"]) < after

        if query.job is not None:
            if query.tenant_id is not None:
                e.when("tenant_id", "=", as_s(query.tenant_id))
            filters = e.take_filter()
            high = f"RUN#{after[0] - 1:020d}" if after is not None else "RUN#~"
            key = f"{e.n('PK')} = {e.v(as_s(job_pk(query.job)))} AND {e.n('SK')} BETWEEN "
            key += f"{e.v(as_s('RUN#'))} AND {e.v(as_s(high))}"
            request = e.finish(KeyConditionExpression=key, ScanIndexForward=False, ConsistentRead=True, **filters)
            items = [] if after is not None and after[0] <= 0 else self.table.query_all(want, **request)
        elif query.dead_letter:
            bound = None if after is None else as_n(after[0])
            partitions = [f"DEAD#{n}" for n in range(SHARDS)]
            items = self._gsi_shards("GSI1", partitions, want, "<=", bound, e, before_cursor, newest=True)
        else:
            e.conditions.append(f"begins_with({e.n('PK')}, {e.v(as_s('JOB#'))})")
            e.conditions.append(f"begins_with({e.n('SK')}, {e.v(as_s('RUN#'))})")
            if after is not None:
                e.when("nominal_ms", "<=", as_n(after[0]))
            scan = e.finish(TotalSegments=SHARDS, **e.take_filter())
            segments = self.table.parallel(
                lambda s: self.table.query_all(None, before_cursor, Segment=s, **scan), list(range(SHARDS))
            )
            items = [i for rows in segments for i in rows]
        runs = sorted((run_from_item(i) for i in items), key=lambda r: (r.nominal_ms, r.run_id), reverse=True)
        page = runs[: query.limit]
        return Page(page, run_cursor(page[-1]) if len(runs) > query.limit and page else None)

    def run_counts(self, job: JobKey) -> dict[RunState, int]:
        e = Expr()
        key = f"{e.n('PK')} = {e.v(as_s(job_pk(job)))} AND begins_with({e.n('SK')}, {e.v(as_s('RUN#'))})"
        request = e.finish(KeyConditionExpression=key, ProjectionExpression=e.n("state"), ConsistentRead=True)
        counts: dict[RunState, int] = {}
        for item in self.table.query_all(None, **request):
            value = item.get("state", {}).get("S")
            if value in RunState.__members__:  # a corrupt item's unknown state is not a state
                state = RunState(value)
                counts[state] = counts.get(state, 0) + 1
        return counts

    def claim(
        self, run_ids: Sequence[str], now_ms: int, owner: str, lease_ms: int, *, due_by_ms: int | None = None
    ) -> list[Run]:
        """A conditional UpdateItem per run (``state = SCHEDULED AND due_ms <= now``, fence+1),
        concurrently; a failed condition means taken, cancelled, not due or missing."""
        expires = now_ms + lease_ms

        def claim_one(run_id: str) -> Run | None:
            key = run_key(run_id)
            if key is None:
                return None
            e = Expr()
            e.set("state", as_s(RunState.CLAIMED.value))
            e.add("fence")
            e.add("version")
            e.set("lease_owner", as_s(owner))
            e.set("lease_expires_ms", as_n(expires))
            e.set("updated_ms", as_n(now_ms))
            e.set("GSI1PK", as_s(f"{RunState.CLAIMED.value}#{shard_of(run_id)}"))
            e.set("GSI1SK", as_n(expires))
            e.when("state", "=", as_s(RunState.SCHEDULED.value))
            e.when("due_ms", "<=", as_n(now_ms if due_by_ms is None else due_by_ms))
            try:
                response = self.table.call(
                    "update_item", **e.update(TableName=self.table.name, Key=key, ReturnValues="ALL_NEW")
                )
            except ConditionFailed:
                return None
            return run_from_item(response["Attributes"])

        claimed = self.table.parallel(claim_one, list(dict.fromkeys(run_ids)))
        return _in_order(r for r in claimed if r is not None)

    def transition(self, transitions: Sequence[Transition]) -> list[Run | None]:
        """One conditional UpdateItem per transition (``ReturnValues=ALL_NEW``), concurrently across
        runs and in order within one run. A transition carrying a job status then moves the job with
        a second, conditional UpdateItem (see docs/dynamodb.md for why not a transaction)."""
        groups: dict[str, list[int]] = {}
        for i, t in enumerate(transitions):
            groups.setdefault(t.run_id, []).append(i)

        def apply_group(indices: list[int]) -> list[tuple[int, Run | None]]:
            return [(i, self._apply(transitions[i])) for i in indices]

        out: list[Run | None] = [None] * len(transitions)
        for done in self.table.parallel(apply_group, list(groups.values())):
            for i, run in done:
                out[i] = run
        return out

    def _apply(self, t: Transition) -> Run | None:
        key = run_key(t.run_id)
        if key is None:
            return None
        e = Expr()
        e.set("state", as_s(t.to_state.value))
        e.add("version")
        if t.bump_fence:
            e.add("fence")
        if t.at_ms is not None:
            e.set("updated_ms", as_n(t.at_ms))
        for name, value in t.changes.items():  # names are whitelisted by Transition
            e.set(name, field_value(name, value))
        plan_gsi1(e, t)
        plan_gsi2(e, t)
        if len(t.expect) == 1:
            e.when("state", "=", as_s(next(iter(t.expect)).value))
        else:
            e.when_in("state", [s.value for s in t.expect])
        if t.expect_fence is not None:
            e.when("fence", "=", as_n(t.expect_fence))
        if t.expect_owner is not None:
            e.when("lease_owner", "=", as_s(t.expect_owner))
        if t.expect_version is not None:
            e.when("version", "=", as_n(t.expect_version))
        try:
            response = self.table.call(
                "update_item", **e.update(TableName=self.table.name, Key=key, ReturnValues="ALL_NEW")
            )
        except ConditionFailed:
            return None
        item = response["Attributes"]
        run = run_from_item(item)
        if run.corrupt is None:  # a marker's placeholders must not steer the index
            self._check_gsi1(key, item, run)
        if t.job_status is not None:
            self._move_job(run.job_key, t.job_status, t.at_ms)
        return run

    def _check_gsi1(self, key: Item, item: Item, run: Run) -> None:
        want = gsi1(run)
        have = (item.get("GSI1PK", {}).get("S"), item.get("GSI1SK", {}).get("N"))
        if have == ((None, None) if want is None else (want[0], str(want[1]))):
            return
        e = Expr()
        e.set("GSI1PK", None if want is None else as_s(want[0]))
        e.set("GSI1SK", None if want is None else as_n(want[1]))
        e.when("version", "=", item["version"])
        with contextlib.suppress(ConditionFailed):  # a later write moved the run on, with its own keys
            self.table.call("update_item", **e.update(TableName=self.table.name, Key=key))

    def _move_job(self, job: JobKey, status: JobStatus, at_ms: int | None) -> None:
        e = Expr()
        e.set("status", as_s(status.value))
        e.add("version")
        if at_ms is not None:
            e.set("updated_ms", as_n(at_ms))
        e.set("GSI2PK", as_s(f"DUE#{shard_of(job.job_id)}") if status is JobStatus.ACTIVE else None)
        e.when_in("status", _FINISHABLE)
        with contextlib.suppress(ConditionFailed):  # a paused, cancelled or missing job is left as it is
            self.table.call("update_item", **e.update(TableName=self.table.name, Key=job_item_key(job)))

    def expired_leases(self, now_ms: int, limit: int) -> list[Run]:
        """16 GSI1 queries per leased state (``<state>#<shard>``, ``GSI1SK < now_ms``), all 48 in
        parallel, merged by lease expiry."""
        if limit <= 0:
            return []
        partitions = [f"{s.value}#{n}" for s in sorted(LEASED_STATES) for n in range(SHARDS)]
        runs = [run_from_item(i) for i in self._gsi_shards("GSI1", partitions, limit, "<", as_n(now_ms))]
        return sorted(runs, key=lambda r: (r.lease_expires_ms or 0, r.run_id))[:limit]

    def expire_results(self, finished_before_ms: int, limit: int) -> int:
        """16 GSI2 queries (``RESULT#<shard>``, ``GSI2SK < finished_before_ms``) in parallel, then
        one conditional UpdateItem per run that removes the result and the run's GSI2 entry. (A
        table TTL cannot do this: it deletes whole items, and a run outlives its result.)"""
        if limit <= 0:
            return 0
        partitions = [f"RESULT#{n}" for n in range(SHARDS)]
        items = self._gsi_shards("GSI2", partitions, limit, "<", as_n(finished_before_ms))
        items = sorted(items, key=lambda i: int(i["GSI2SK"]["N"]))[:limit]

        def clear(item: Item) -> bool:
            e = Expr()
            for name in ("result", "GSI2PK", "GSI2SK"):
                e.set(name, None)
            e.when("finished_ms", "<", as_n(finished_before_ms))
            e.when_in("state", sorted(s.value for s in TERMINAL_STATES))
            key = {"PK": item["PK"], "SK": item["SK"]}
            try:
                response = self.table.call(
                    "update_item", **e.update(TableName=self.table.name, Key=key, ReturnValues="UPDATED_OLD")
                )
            except ConditionFailed:
                return False  # redriven meanwhile: it left GSI2 with that write
            return "result" in response.get("Attributes", {})

        return sum(self.table.parallel(clear, items))

    def overdue_runs(self, before_ms: int, limit: int) -> list[Run]:
        """Tier by tier, CRITICAL first: 16 GSI1 queries (``SCHEDULED#<tier>#<shard>``,
        ``GSI1SK <= before_ms``) in parallel, stopping once `limit` runs are found."""
        found: list[Run] = []
        for priority in PRIORITIES_BY_RANK:
            if len(found) >= limit:
                break
            left = limit - len(found)
            partitions = [f"SCHEDULED#{priority.value}#{n}" for n in range(SHARDS)]
            runs = [run_from_item(i) for i in self._gsi_shards("GSI1", partitions, left, "<=", as_n(before_ms))]
            found.extend(sorted(runs, key=lambda r: (r.due_ms, r.run_id))[:left])
        return found

    def _gsi_shards(
        self,
        index: str,
        partitions: Sequence[str],
        limit: int,
        op: str,
        bound: dict[str, str] | tuple[dict[str, str], dict[str, str]] | None,
        e: Expr | None = None,
        keep: Callable[[Item], bool] | None = None,
        *,
        newest: bool = False,
    ) -> list[Item]:
        """Up to `limit` items from each partition of `index` whose sort key is `op bound` (any
        when `bound` is None) and that pass `e`'s conditions (as a filter) and `keep`, queried in
        parallel; the caller merges. Descending sort-key order when `newest`."""
        e = e or Expr()
        filters = e.take_filter()
        key = f"{e.n(index + 'PK')} = :pk"
        if isinstance(bound, tuple):  # BETWEEN
            key += f" AND {e.n(index + 'SK')} BETWEEN {e.v(bound[0])} AND {e.v(bound[1])}"
        elif bound is not None and op == "begins_with":
            key += f" AND begins_with({e.n(index + 'SK')}, {e.v(bound)})"
        elif bound is not None:
            key += f" AND {e.n(index + 'SK')} {op} {e.v(bound)}"
        base = e.finish(IndexName=index, KeyConditionExpression=key, ScanIndexForward=not newest, **filters)
        values = base.pop("ExpressionAttributeValues", {})

        def one(partition: str) -> list[Item]:
            return self.table.query_all(
                limit, keep, ExpressionAttributeValues={**values, ":pk": as_s(partition)}, **base
            )

        return [item for rows in self.table.parallel(one, partitions) for item in rows]

    # -- idempotency and workers ---------------------------------------------------------------

    def idempotency(self, tenant_id: str, key: str, now_ms: int) -> IdempotencyRecord | None:
        item = self._get(idempotency_pk(tenant_id, key), "IDEM")
        record = None if item is None else flat_record(IdempotencyRecord, item)
        return record if record is not None and record.expires_ms > now_ms else None

    def register_worker(self, worker_id: str, tasks: Sequence[str], queues: Sequence[str], now_ms: int) -> None:
        item = {
            "PK": as_s(WORKERS_PK),
            "SK": as_s(worker_id),
            "tasks": {"L": [as_s(t) for t in sorted(tasks)]},
            "queues": {"L": [as_s(q) for q in queues]},
            "seen_ms": as_n(now_ms),
        }
        self.table.call("put_item", TableName=self.table.name, Item=item)

    def known_tasks(self) -> set[str]:
        e = Expr()
        request = e.finish(
            KeyConditionExpression=f"{e.n('PK')} = {e.v(as_s(WORKERS_PK))}",
            ProjectionExpression=e.n("tasks"),
            ConsistentRead=True,
        )
        return {t["S"] for item in self.table.query_all(None, **request) for t in item["tasks"]["L"]}

    # -- the daemon registry and the census (jobq.store.dynamodb_census) ----------------------

    def heartbeat(self, records: Sequence[DaemonRecord], ttl_ms: int) -> None:
        dynamodb_census.heartbeat(self.table, records, ttl_ms)

    def live_daemons(self, now_ms: int) -> list[DaemonRecord]:
        return dynamodb_census.live_daemons(self.table, now_ms)

    def deregister(self, daemon_ids: Sequence[str]) -> None:
        dynamodb_census.deregister(self.table, daemon_ids)

    def census(self, now_ms: int) -> Census:
        """Sampled: `census_shards` of the 16 shards, scaled (`Census.exact` is False)."""
        return dynamodb_census.census(self.table, now_ms, self.census_shards)

    def publish_tasks(self, tasks: Sequence[TaskInfo]) -> None:
        items = [
            {
                "PK": as_s(TASKS_PK),
                "SK": as_s(t.name),
                "doc": as_s(t.model_dump_json()),
                "published_ms": as_n(t.published_ms),
            }
            for t in {t.name: t for t in tasks}.values()
        ]
        for start in range(0, len(items), 25):  # BatchWriteItem's limit
            requests = {self.table.name: [{"PutRequest": {"Item": item}} for item in items[start : start + 25]]}
            while requests:
                answer = self.table.call("batch_write_item", RequestItems=requests)
                requests = answer.get("UnprocessedItems") or {}

    def task_catalogue(self, names: Sequence[str] | None = None) -> dict[str, TaskInfo]:
        e = Expr()
        request = e.finish(
            KeyConditionExpression=f"{e.n('PK')} = {e.v(as_s(TASKS_PK))}",
            ProjectionExpression=e.n("doc"),
            ConsistentRead=True,
        )
        wanted = None if names is None else set(names)
        found = decode_tasks(item["doc"]["S"] for item in self.table.query_all(None, **request))
        return {n: t for n, t in found.items() if wanted is None or n in wanted}

    # -- tokens and tenants --------------------------------------------------------------------

    def put_token(self, token: ApiToken) -> None:
        """The token and its hash's lookup item in one transaction, each only if absent."""
        items = [
            self._put_if_absent(flat_item(token, TOKENS_PK, token.token_id)),
            self._put_if_absent(flat_item(token, f"TOKENHASH#{token.token_hash}", "TOKENHASH")),
        ]
        try:
            self.table.call("transact_write_items", TransactItems=items, ClientRequestToken=uuid.uuid4().hex)
        except TransactionCancelled as exc:
            if exc.condition_failed:
                raise Conflict(f"token {token.token_id!r} exists") from None
            raise exc.unexpected(f"storing token {token.token_id!r}") from None

    def find_token(self, token_hash: str) -> ApiToken | None:
        key = token_hash_key(token_hash)
        item = self._get(key["PK"]["S"], key["SK"]["S"])
        return None if item is None else flat_record(ApiToken, item)

    def list_tokens(self, tenant_id: str | None = None) -> list[ApiToken]:
        e = Expr()
        request = e.finish(KeyConditionExpression=f"{e.n('PK')} = {e.v(as_s(TOKENS_PK))}", ConsistentRead=True)
        tokens = [flat_record(ApiToken, i) for i in self.table.query_all(None, **request)]
        mine = [t for t in tokens if tenant_id is None or t.tenant_id == tenant_id]
        return sorted(mine, key=lambda t: (t.created_ms, t.token_id))

    def revoke_token(self, token_id: str, now_ms: int) -> bool:
        """Both copies of the token in one transaction, conditional on it being active."""
        item = self._get(TOKENS_PK, token_id)
        if item is None or "revoked_ms" in item:
            return False
        token = flat_record(ApiToken, item)
        updates = []
        for key in ({"PK": as_s(TOKENS_PK), "SK": as_s(token_id)}, token_hash_key(token.token_hash)):
            e = Expr()
            e.set("revoked_ms", as_n(now_ms))
            e.conditions.append(f"attribute_exists(PK) AND attribute_not_exists({e.n('revoked_ms')})")
            updates.append({"Update": e.update(TableName=self.table.name, Key=key)})
        try:
            self.table.call("transact_write_items", TransactItems=updates, ClientRequestToken=uuid.uuid4().hex)
        except TransactionCancelled as exc:
            if exc.condition_failed:
                return False  # revoked by someone else in between
            raise exc.unexpected(f"revoking token {token_id!r}") from None
        return True

    def tenant_secret(self, tenant_id: str, candidate: str) -> str:
        """One UpdateItem: ``SET webhook_secret = if_not_exists(webhook_secret, candidate)``."""
        e = Expr()
        secret = e.n("webhook_secret")
        e.sets.append(f"{secret} = if_not_exists({secret}, {e.v(as_s(candidate))})")
        e.set("tenant_id", as_s(tenant_id))
        key = {"PK": as_s(f"TENANT#{tenant_segment(tenant_id)}"), "SK": as_s("SECRET")}
        response = self.table.call(
            "update_item", **e.update(TableName=self.table.name, Key=key, ReturnValues="ALL_NEW")
        )
        return str(response["Attributes"]["webhook_secret"]["S"])

    def _get(self, pk: str, sk: str) -> Item | None:
        """A strongly consistent GetItem; None when absent."""
        response = self.table.call(
            "get_item", TableName=self.table.name, Key={"PK": as_s(pk), "SK": as_s(sk)}, ConsistentRead=True
        )
        item: Item | None = response.get("Item")
        return item

    def close(self) -> None:
        self.table.close()
