"""The in-memory reference store: one process, thread-safe, the semantics every backend matches."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from jobq.errors import Conflict, DuplicateJob, IdempotencyConflict, JobNotFound
from jobq.models import (
    LEASED_STATES,
    ApiToken,
    IdempotencyRecord,
    Job,
    JobStatus,
    Run,
    RunState,
    Transition,
)
from jobq.ports import CreateResult, JobQuery, Page, RunQuery

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
    )


def run_matches(run: Run, query: RunQuery) -> bool:
    return (
        (query.job_id is None or run.job_id == query.job_id)
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


class MemoryStore:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._jobs: dict[str, Job] = {}
        self._runs: dict[str, Run] = {}
        self._idempotency: dict[tuple[str, str], IdempotencyRecord] = {}
        self._workers: dict[str, set[str]] = {}
        self._tokens: dict[str, ApiToken] = {}
        self._secrets: dict[str, str] = {}

    def create_job(self, job: Job, runs: Sequence[Run], idempotency: IdempotencyRecord | None = None) -> CreateResult:
        with self._lock:
            if idempotency is not None:
                known = self._idempotency.get((idempotency.tenant_id, idempotency.key))
                if known is not None and known.expires_ms > idempotency.created_ms:
                    if known.fingerprint != idempotency.fingerprint:
                        raise IdempotencyConflict(idempotency.key)
                    original = self._jobs.get(known.job_id)
                    if original is not None:
                        return CreateResult(original.model_copy(), created=False, response=known.response)
            if job.job_id in self._jobs:
                raise DuplicateJob(job.job_id)
            self._jobs[job.job_id] = job.model_copy()
            for run in runs:
                self._runs.setdefault(run.run_id, run.model_copy())
            if idempotency is not None:
                self._idempotency[(idempotency.tenant_id, idempotency.key)] = idempotency
            return CreateResult(job.model_copy(), created=True)

    def create_jobs(self, items: Sequence[tuple[Job, Sequence[Run]]]) -> list[bool]:
        out = []
        with self._lock:
            for job, runs in items:
                try:
                    out.append(self.create_job(job, runs).created)
                except DuplicateJob:
                    out.append(False)
        return out

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, Job]:
        with self._lock:
            return {i: self._jobs[i].model_copy() for i in job_ids if i in self._jobs}

    def list_jobs(self, query: JobQuery) -> Page[Job]:
        with self._lock:
            ids = sorted(i for i, j in self._jobs.items() if job_matches(j, query))
        if query.cursor:
            ids = [i for i in ids if i > query.cursor]
        page = ids[: query.limit]
        jobs = self.get_jobs(page)
        more = len(ids) > query.limit
        return Page([jobs[i] for i in page if i in jobs], page[-1] if more and page else None)

    def update_job(self, job: Job) -> Job:
        with self._lock:
            current = self._jobs.get(job.job_id)
            if current is None:
                raise JobNotFound(job.job_id)
            if current.version != job.version:
                raise Conflict(f"job {job.job_id!r} changed (version {current.version}, expected {job.version})")
            stored = job.model_copy(update={"version": job.version + 1})
            self._jobs[job.job_id] = stored
            return stored.model_copy()

    def due_jobs(self, before_ms: int, limit: int) -> list[Job]:
        with self._lock:
            due = [
                j
                for j in self._jobs.values()
                if j.status is JobStatus.ACTIVE and j.next_fire_ms is not None and j.next_fire_ms <= before_ms
            ]
        due.sort(key=lambda j: (j.next_fire_ms or 0, j.job_id))
        return [j.model_copy() for j in due[:limit]]

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

    def run_counts(self, job_id: str) -> dict[RunState, int]:
        counts: dict[RunState, int] = {}
        with self._lock:
            for run in self._runs.values():
                if run.job_id == job_id:
                    counts[run.state] = counts.get(run.state, 0) + 1
        return counts

    def claim(self, run_ids: Sequence[str], now_ms: int, owner: str, lease_ms: int) -> list[Run]:
        claimed = []
        with self._lock:
            for run_id in run_ids:
                run = self._runs.get(run_id)
                if run is None or run.state is not RunState.SCHEDULED or run.due_ms > now_ms:
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
                job = self._jobs.get(run.job_id)
                if t.job_status is not None and job is not None and job.status in _FINISHABLE:
                    self._jobs[job.job_id] = job.model_copy(
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

    def close(self) -> None:
        pass
