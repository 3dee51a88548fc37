"""The in-memory reference store: one process, thread-safe, the semantics every backend matches.

Its records are objects, so they always decode; `put_raw_job` and `put_raw_run` store what a
row would decode to (a corrupt marker, for a bad one), so that the quarantine of records that do
not decode is tested here as on the other backends.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from jobq.errors import Conflict, DuplicateJob, IdempotencyConflict, JobNotFound, JobqError
from jobq.joblist import job_cursor_of, parse_job_cursor
from jobq.models import (
    LEASED_STATES,
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
from jobq.records import decode_job, decode_run, decode_tasks
from jobq.registry import Census, DaemonRecord, census_from_rows, expiring
from jobq.sharding import job_shard

_FINISHABLE = frozenset({JobStatus.ACTIVE, JobStatus.COMPLETED})


def transition_applies(run: Run, t: Transition) -> bool:
    return (
        run.state in t.expect
        and (t.expect_fence is None or run.fence == t.expect_fence)
        and (t.expect_owner is None or run.lease_owner == t.expect_owner)
        and (t.expect_version is None or run.version == t.expect_version)
    )


def applied(run: Run, t: Transition) -> Run:
    """The run after the transition (the caller has checked that it applies)."""
    update = dict(t.changes)
    update["state"] = t.to_state
    update["version"] = run.version + 1
    if t.bump_fence:
        update["fence"] = run.fence + 1
    if t.at_ms is not None:
        update["updated_ms"] = t.at_ms
    return run.model_copy(update=update)


def job_matches(job: Job, query: JobQuery) -> bool:
    return (
        (query.tenant_id is None or job.tenant_id == query.tenant_id)
        and (query.status is None or job.status == query.status)
        and (query.priority is None or job.priority == query.priority)
        and (query.name_prefix is None or job.name.startswith(query.name_prefix))
        and (query.id_prefix is None or job.job_id.startswith(query.id_prefix))
    )


def run_matches(run: Run, query: RunQuery) -> bool:
    return (
        (query.job is None or (run.job_id == query.job.job_id and run.tenant_id == query.job.tenant_id))
        and (query.tenant_id is None or run.tenant_id == query.tenant_id)
        and (not query.states or run.state in query.states)
        and (query.dead_letter is None or run.dead_letter == query.dead_letter)
    )


def run_cursor(run: Run) -> str:
    return f"{run.nominal_ms}|{run.run_id}"


def parse_run_cursor(cursor: str) -> tuple[int, str]:
    nominal, _, run_id = cursor.partition("|")
    try:
        return int(nominal), run_id
    except ValueError:
        raise Conflict(f"invalid cursor {cursor!r}") from None


def job_cursor(job: Job) -> str:
    """Jobs are listed by (job id, tenant): two tenants may share an id."""
    return job_cursor_of(job.job_id, job.tenant_id)


def after_job_cursor(job: Job, cursor: str, descending: bool = False) -> bool:
    """Whether `job` comes after `cursor` in a listing (ascending, or descending for `newest_first`)."""
    job_id, tenant = parse_job_cursor(cursor)
    if tenant is None:
        return job.job_id < job_id if descending else job.job_id > job_id
    if descending:
        return (job.job_id, job.tenant_id) < (job_id, tenant)
    return (job.job_id, job.tenant_id) > (job_id, tenant)


def refuse_corrupt(job: Job) -> None:
    """`update_job` rewrites the whole record: a marker's placeholders must never be stored."""
    if job.corrupt is not None:
        raise Conflict(f"job {str(job.key)!r} does not decode ({job.corrupt}); only its status can change")


class MemoryStore:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._jobs: dict[JobKey, Job] = {}
        self._runs: dict[str, Run] = {}
        self._idempotency: dict[tuple[str, str], IdempotencyRecord] = {}
        self._workers: dict[str, set[str]] = {}
        self._tasks: dict[str, str] = {}  # JSON, as the other stores keep it
        self._tokens: dict[str, ApiToken] = {}
        self._secrets: dict[str, str] = {}
        self._daemons: dict[str, DaemonRecord] = {}

    def create_job(self, job: Job, runs: Sequence[Run], idempotency: IdempotencyRecord | None = None) -> CreateResult:
        with self._lock:
            if idempotency is not None:
                known = self._idempotency.get((idempotency.tenant_id, idempotency.key))
                if known is not None and known.expires_ms > idempotency.created_ms:
                    if known.fingerprint != idempotency.fingerprint:
                        raise IdempotencyConflict(idempotency.key)
                    original = self._jobs.get(known.job_key)
                    if original is not None:
                        return CreateResult(original.model_copy(), created=False, response=known.response)
            if job.key in self._jobs:
                raise DuplicateJob(job.job_id)
            self._jobs[job.key] = job.model_copy()
            for run in runs:
                self._runs.setdefault(run.run_id, run.model_copy())
            if idempotency is not None:
                self._idempotency[(idempotency.tenant_id, idempotency.key)] = idempotency
            return CreateResult(job.model_copy(), created=True)

    def create_job_group(self, requests: Sequence[CreateRequest]) -> list[CreateResult | JobqError]:
        out: list[CreateResult | JobqError] = []
        with self._lock:
            for r in requests:
                try:
                    out.append(self.create_job(r.job, r.runs, r.idempotency))
                except JobqError as exc:
                    out.append(exc)
        return out

    def create_jobs(self, items: Sequence[tuple[Job, Sequence[Run]]]) -> list[bool]:
        out = []
        with self._lock:
            for job, runs in items:
                try:
                    out.append(self.create_job(job, runs).created)
                except DuplicateJob:
                    out.append(False)
        return out

    def get_jobs(self, keys: Sequence[JobKey]) -> dict[JobKey, Job]:
        with self._lock:
            return {k: self._jobs[k].model_copy() for k in keys if k in self._jobs}

    def list_jobs(self, query: JobQuery) -> Page[Job]:
        with self._lock:
            jobs = [j for j in self._jobs.values() if job_matches(j, query)]
        jobs.sort(key=lambda j: (j.job_id, j.tenant_id), reverse=query.newest_first)
        if query.cursor:
            cursor = query.cursor
            jobs = [j for j in jobs if after_job_cursor(j, cursor, query.newest_first)]
        page = [j.model_copy() for j in jobs[: query.limit]]
        more = len(jobs) > query.limit
        return Page(page, job_cursor(page[-1]) if more and page else None)

    def update_job(self, job: Job) -> Job:
        refuse_corrupt(job)
        with self._lock:
            current = self._jobs.get(job.key)
            if current is None:
                raise JobNotFound(str(job.key))
            if current.version != job.version:
                raise Conflict(f"job {str(job.key)!r} changed (version {current.version}, expected {job.version})")
            stored = job.model_copy(update={"version": job.version + 1})
            self._jobs[job.key] = stored
            return stored.model_copy()

    def set_job_status(
        self, key: JobKey, status: JobStatus, expect: frozenset[JobStatus], now_ms: int, reason: str | None = None
    ) -> bool:
        with self._lock:
            job = self._jobs.get(key)
            if job is None or job.status not in expect:
                return False
            update = {"status": status, "status_reason": reason, "version": job.version + 1, "updated_ms": now_ms}
            self._jobs[key] = job.model_copy(update=update)
            return True

    def due_jobs(self, before_ms: int, limit: int, shards: Collection[int] | None = None) -> list[Job]:
        wanted = None if shards is None else frozenset(shards)
        with self._lock:
            due = [
                j
                for j in self._jobs.values()
                if j.status is JobStatus.ACTIVE
                and j.next_fire_ms is not None
                and j.next_fire_ms <= before_ms
                and (wanted is None or job_shard(j.job_id) in wanted)
            ]
        due.sort(key=lambda j: (j.priority.rank, j.next_fire_ms or 0, j.job_id, j.tenant_id))
        return [j.model_copy() for j in due[:limit]]

    def advance_jobs(self, items: Sequence[tuple[Job, Sequence[Run]]]) -> list[bool]:
        advanced: list[bool] = []
        with self._lock:
            for job, runs in items:
                current = self._jobs.get(job.key)
                applies = job.corrupt is None and current is not None and current.version == job.version
                advanced.append(applies)
                if not applies:
                    continue
                self._jobs[job.key] = job.model_copy(update={"version": job.version + 1})
                for run in runs:
                    self._runs.setdefault(run.run_id, run.model_copy())
        return advanced

    def add_runs(self, runs: Sequence[Run]) -> list[Run]:
        added = []
        with self._lock:
            for run in runs:
                if run.run_id not in self._runs:
                    self._runs[run.run_id] = run.model_copy()
                    added.append(run.model_copy())
        return added

    def get_runs(self, run_ids: Sequence[str]) -> dict[str, Run]:
        with self._lock:
            return {i: self._runs[i].model_copy() for i in run_ids if i in self._runs}

    def list_runs(self, query: RunQuery) -> Page[Run]:
        with self._lock:
            runs = [r for r in self._runs.values() if run_matches(r, query)]
        runs.sort(key=lambda r: (r.nominal_ms, r.run_id), reverse=True)
        if query.cursor:
            after = parse_run_cursor(query.cursor)
            runs = [r for r in runs if (r.nominal_ms, r.run_id) < after]
        page = runs[: query.limit]
        more = len(runs) > query.limit
        return Page([r.model_copy() for r in page], run_cursor(page[-1]) if more and page else None)

    def run_counts(self, job: JobKey) -> dict[RunState, int]:
        counts: dict[RunState, int] = {}
        with self._lock:
            for run in self._runs.values():
                if run.job_id == job.job_id and run.tenant_id == job.tenant_id:
                    counts[run.state] = counts.get(run.state, 0) + 1
        return counts

    def claim(
        self, run_ids: Sequence[str], now_ms: int, owner: str, lease_ms: int, *, due_by_ms: int | None = None
    ) -> list[Run]:
        claimed = []
        due_by = now_ms if due_by_ms is None else due_by_ms
        with self._lock:
            for run_id in run_ids:
                run = self._runs.get(run_id)
                if run is None or run.state is not RunState.SCHEDULED or run.due_ms > due_by:
                    continue
                new = run.model_copy(
                    update={
                        "state": RunState.CLAIMED,
                        "fence": run.fence + 1,
                        "version": run.version + 1,
                        "lease_owner": owner,
                        "lease_expires_ms": now_ms + lease_ms,
                        "updated_ms": now_ms,
                    }
                )
                self._runs[run_id] = new
                claimed.append(new.model_copy())
        return claimed

    def transition(self, transitions: Sequence[Transition]) -> list[Run | None]:
        out: list[Run | None] = []
        with self._lock:
            for t in transitions:
                run = self._runs.get(t.run_id)
                if run is None or not transition_applies(run, t):
                    out.append(None)
                    continue
                new = applied(run, t)
                self._runs[t.run_id] = new
                out.append(new.model_copy())
                job = self._jobs.get(run.job_key)
                if t.job_status is not None and job is not None and job.status in _FINISHABLE:
                    self._jobs[job.key] = job.model_copy(
                        update={
                            "status": t.job_status,
                            "version": job.version + 1,
                            "updated_ms": t.at_ms or job.updated_ms,
                        }
                    )
        return out

    def expired_leases(self, now_ms: int, limit: int) -> list[Run]:
        with self._lock:
            expired = [
                r
                for r in self._runs.values()
                if r.state in LEASED_STATES and r.lease_expires_ms is not None and r.lease_expires_ms < now_ms
            ]
        expired.sort(key=lambda r: (r.lease_expires_ms or 0, r.run_id))
        return [r.model_copy() for r in expired[:limit]]

    def overdue_runs(self, before_ms: int, limit: int) -> list[Run]:
        with self._lock:
            due = [r for r in self._runs.values() if r.state is RunState.SCHEDULED and r.due_ms <= before_ms]
        due.sort(key=lambda r: (r.priority.rank, r.due_ms, r.run_id))
        return [r.model_copy() for r in due[:limit]]

    def expire_results(self, finished_before_ms: int, limit: int) -> int:
        with self._lock:
            held = [
                r
                for r in self._runs.values()
                if r.result is not None
                and r.state in TERMINAL_STATES
                and r.finished_ms is not None
                and r.finished_ms < finished_before_ms
            ]
            held.sort(key=lambda r: (r.finished_ms or 0, r.run_id))
            for run in held[:limit]:
                self._runs[run.run_id] = run.model_copy(update={"result": None})
        return min(len(held), limit)

    def idempotency(self, tenant_id: str, key: str, now_ms: int) -> IdempotencyRecord | None:
        with self._lock:
            record = self._idempotency.get((tenant_id, key))
        return record if record is not None and record.expires_ms > now_ms else None

    def register_worker(self, worker_id: str, tasks: Sequence[str], queues: Sequence[str], now_ms: int) -> None:
        with self._lock:
            self._workers[worker_id] = set(tasks)

    def known_tasks(self) -> set[str]:
        with self._lock:
            return set().union(*self._workers.values()) if self._workers else set()

    def heartbeat(self, records: Sequence[DaemonRecord], ttl_ms: int) -> None:
        with self._lock:
            for record in records:
                self._daemons[record.daemon_id] = expiring(record, ttl_ms)

    def live_daemons(self, now_ms: int) -> list[DaemonRecord]:
        with self._lock:
            live = [r for r in self._daemons.values() if r.expires_ms > now_ms]
        return sorted(live, key=lambda r: (r.role.value, r.daemon_id))

    def deregister(self, daemon_ids: Sequence[str]) -> None:
        with self._lock:
            for daemon_id in daemon_ids:
                self._daemons.pop(daemon_id, None)

    def census(self, now_ms: int) -> Census:
        rows: dict[tuple[str, int], dict[str, Any]] = {}
        finished: dict[str, int] = {}
        dead = 0
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            dead += run.dead_letter
            if run.state.terminal:
                finished[run.state.value] = finished.get(run.state.value, 0) + 1
                continue
            key = (run.state.value, run.priority.rank)
            row = rows.setdefault(
                key,
                {
                    "state": key[0],
                    "priority": key[1],
                    "n": 0,
                    "due": 0,
                    "oldest_due_ms": None,
                    "oldest_dispatched_ms": None,
                },
            )
            row["n"] += 1
            if run.state in (RunState.SCHEDULED, RunState.CLAIMED) and run.due_ms <= now_ms:
                row["due"] += 1
                row["oldest_due_ms"] = min(row["oldest_due_ms"] or run.due_ms, run.due_ms)
            if run.state is RunState.DISPATCHED:
                at = run.dispatched_ms or run.updated_ms
                row["oldest_dispatched_ms"] = min(row["oldest_dispatched_ms"] or at, at)
        return census_from_rows(now_ms, list(rows.values()), dead, finished)

    def publish_tasks(self, tasks: Sequence[TaskInfo]) -> None:
        with self._lock:
            self._tasks.update({t.name: t.model_dump_json() for t in tasks})

    def task_catalogue(self, names: Sequence[str] | None = None) -> dict[str, TaskInfo]:
        with self._lock:
            docs = [d for n, d in self._tasks.items() if names is None or n in names]
        return decode_tasks(docs)

    def put_token(self, token: ApiToken) -> None:
        with self._lock:
            if token.token_id in self._tokens or any(t.token_hash == token.token_hash for t in self._tokens.values()):
                raise Conflict(f"token {token.token_id!r} exists")
            self._tokens[token.token_id] = token

    def find_token(self, token_hash: str) -> ApiToken | None:
        with self._lock:
            return next((t for t in self._tokens.values() if t.token_hash == token_hash), None)

    def list_tokens(self, tenant_id: str | None = None) -> list[ApiToken]:
        with self._lock:
            tokens = [t for t in self._tokens.values() if tenant_id is None or t.tenant_id == tenant_id]
        return sorted(tokens, key=lambda t: (t.created_ms, t.token_id))

    def revoke_token(self, token_id: str, now_ms: int) -> bool:
        with self._lock:
            token = self._tokens.get(token_id)
            if token is None or not token.active:
                return False
            self._tokens[token_id] = token.model_copy(update={"revoked_ms": now_ms})
            return True

    def tenant_secret(self, tenant_id: str, candidate: str) -> str:
        with self._lock:
            return self._secrets.setdefault(tenant_id, candidate)

    # -- raw records (tests) ----------------------------------------------------------------------

    def put_raw_job(self, document: Mapping[str, Any], **columns: Any) -> Job:
        """Store a job document as another version or a hand-written row might have left it,
        decoded as the SQL stores decode a row (`columns` are the row's plain columns, e.g.
        `status`); returns what reads will see (a corrupt marker when it does not decode)."""
        plain = {name: document.get(name) for name in ("job_id", "tenant_id", "name", "status", "version")}
        job = decode_job(json.dumps(document), {**{k: v for k, v in plain.items() if v is not None}, **columns})
        with self._lock:
            self._jobs[job.key] = job
        return job

    def put_raw_run(self, fields: Mapping[str, Any]) -> Run:
        """Store a run row as another version or a hand-written row might have left it (see
        `put_raw_job`)."""
        run = decode_run(fields)
        with self._lock:
            self._runs[run.run_id] = run
        return run

    def close(self) -> None:
        pass
