"""The control plane: submit, inspect, pause, resume, cancel, trigger jobs; read and redrive dead letters.

Every change goes through the store's compare-and-set, so a client racing a daemon (or another
client) loses cleanly instead of corrupting a run.

Jobs are named by tenant and job id. Methods take a `JobKey`, or a string: a job id in the
client's tenant (`default` when the client is not confined to one), or `TENANT/JOB_ID`. A client
confined to a tenant (`tenant_id=`) finds nothing of another tenant's: `JobNotFound`, exactly as
if it did not exist.

A job whose stored record does not decode (a corrupt marker, `Job.corrupt`) can be read and
cancelled (a status write that leaves the record as it is); pause, resume and trigger refuse it.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobq import tracing
from jobq.clock import Clock
from jobq.codec import encode, envelope_for
from jobq.deployment import Deployment
from jobq.errors import (
    Conflict,
    InvalidJob,
    JobNotFound,
    JobqError,
    ResultTimeout,
    RunNotFound,
    TransportError,
    UnknownTask,
)
from jobq.groupcommit import GroupCommit
from jobq.models import (
    DEFAULT_TENANT,
    PAUSED,
    PAUSED_RECHECK_MS,
    TERMINAL_STATES,
    IdempotencyRecord,
    Job,
    JobKey,
    JobStatus,
    Run,
    RunEvent,
    RunState,
    ScheduleType,
    TaskInfo,
    TaskTarget,
    Transition,
)
from jobq.ports import CreateRequest, CreateResult, IndexEntry, JobQuery, Page, RunQuery
from jobq.results import ResultState, RunResult, read_result
from jobq.texts import text_problem

if TYPE_CHECKING:
    from jobq.submission import JobSpec, Limits

_OPEN = frozenset(RunState) - TERMINAL_STATES
# The task catalogue as last read, per store, and until when (clock ms) it serves submissions: the
# API builds a Client per request, so the cache lives beside the store. A task missing from it is
# read again at once, so a worker's first publication applies to the next submission; a changed
# declaration applies within CATALOGUE_TTL_MS.
_CATALOGUES: weakref.WeakKeyDictionary[object, tuple[int, dict[str, TaskInfo]]] = weakref.WeakKeyDictionary()
CATALOGUE_TTL_MS = 1000
_SUBMITTER = "submitter"  # the lease owner of a run dispatched at submission

#: How callers name a job: its key, or a job id (in the client's tenant) or `TENANT/JOB_ID`.
JobRef = str | JobKey


@dataclass(frozen=True, slots=True)
class Submitted:
    job: Job
    created: bool  # False when an Idempotency-Key replayed an earlier submission
    response: str | None = None  # the replayed response, verbatim
    next_fire_times: tuple[int, ...] = ()
    warnings: tuple[str, ...] = ()  # e.g. a task no worker has served yet


@dataclass(frozen=True, slots=True)
class JobView:
    job: Job
    current_run: Run | None
    counts: dict[str, int]
    next_fire_times: tuple[int, ...]


class Client:
    def __init__(self, deployment: Deployment, *, tenant_id: str | None = None) -> None:
        self.d = deployment
        self.store = deployment.store
        self.clock: Clock = deployment.clock
        self.tenant_id = tenant_id  # when set, every call is confined to this tenant

    @functools.cached_property
    def limits(self) -> Limits:
        """The submission limits of the deployment's settings, loaded on first use (a reading
        command needs neither them nor the scheduling code behind them)."""
        from jobq.submission import Limits

        return Limits.from_settings(self.d.settings)

    # -- submitting -----------------------------------------------------------------------------

    def submit(
        self,
        spec: JobSpec | Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
        respond: Callable[[Job, builtins.list[int]], str] | None = None,
        fingerprint: str | None = None,
        known_tasks: set[str] | None = None,
        declared_by: str | None = None,
        trace: str | None = None,
    ) -> Submitted:
        """Validate and store the job with its first runs (and idempotency key) atomically.

        `spec` is a `JobSpec` or a mapping of its fields; either is parsed here (`JobSpec.parse`),
        so a spec built without validation is checked too. A spec that names no tenant is this
        client's tenant. `respond(job, next_fire_times)` renders the response to keep with the
        key, so a replay returns it verbatim; `fingerprint` overrides the spec's (the API hashes
        the request as sent). `declared_by` marks the job as a declared schedule of that app
        (`jobq.periodic`). `trace` is the submitter's W3C traceparent when it is not the current
        span's (the API passes its request's); the job and its runs keep the trace of the
        `jobq.submit` span made here. Raises `InvalidJob` (nothing written), `IdempotencyConflict`,
        `DuplicateJob`.

        A TASK target takes the priority, retry policy and timeout its task declared (the task
        catalogue) wherever the spec sets none. A task no worker has published is refused
        (`UnknownTask`) when `known_tasks` is given and lacks it or the setting `unknown_tasks` is
        `refuse`; otherwise the job is stored and `Submitted.warnings` says it waits for a worker."""
        from jobq.submission import JobSpec

        return self.submit_parsed(
            JobSpec.parse(spec, tenant_id=self.tenant_id),
            idempotency_key=idempotency_key,
            respond=respond,
            fingerprint=fingerprint,
            known_tasks=known_tasks,
            declared_by=declared_by,
            trace=trace,
        )

    def submit_parsed(
        self,
        spec: JobSpec,
        *,
        idempotency_key: str | None = None,
        respond: Callable[[Job, builtins.list[int]], str] | None = None,
        fingerprint: str | None = None,
        known_tasks: set[str] | None = None,
        declared_by: str | None = None,
        trace: str | None = None,
    ) -> Submitted:
        """`submit` for a spec that `JobSpec.parse` has just returned, neither copied nor changed
        since: the same, without validating it a second time (`Task.schedule` parses the call's
        arguments to name them in its errors, and validation is a fifth of a submission's CPU)."""
        from jobq.submission import build_job, check_idempotency_key, preview, with_declared

        if self.tenant_id is not None and spec.tenant_id != self.tenant_id:
            raise InvalidJob(f"tenant_id {spec.tenant_id!r} is not this token's tenant", field="tenant_id")
        if idempotency_key is not None:
            check_idempotency_key(idempotency_key)
        # Of the request, not of what the catalogue adds; only a key's record keeps one.
        request_print = (fingerprint or spec.fingerprint()) if idempotency_key is not None else ""
        warnings: tuple[str, ...] = ()
        if isinstance(spec.target, TaskTarget):
            task = spec.target.task
            catalogue = self._catalogue(task)
            spec = with_declared(spec, catalogue.get(task))
            warnings = self._unserved(task, catalogue, known_tasks)
        now = self.clock.now_ms()
        attributes = {"jobq.tenant_id": spec.tenant_id}
        with tracing.span("jobq.submit", parent=trace, kind="producer", attributes=attributes) as span:
            submitter = tracing.current_traceparent() or tracing.valid_traceparent(trace)
            job, runs, _missed = build_job(spec, now, self.limits, known_tasks, submitter)
            if declared_by is not None:
                job = job.model_copy(update={"declared_by": declared_by})
            tracing.set_attributes(span, {"jobq.job_id": job.job_id, "jobq.schedule_type": job.schedule.type.value})
            if job.schedule.type is ScheduleType.IMMEDIATE:
                runs = [self._dispatched(run, now) for run in runs]
            fires = preview(job, now)
            response = respond(job, fires) if respond is not None else None
            record = None
            if idempotency_key is not None:
                record = IdempotencyRecord(
                    tenant_id=spec.tenant_id,
                    key=idempotency_key,
                    fingerprint=request_print,
                    job_id=job.job_id,
                    response=response,
                    created_ms=now,
                    expires_ms=now + self.d.settings.idempotency_ttl_s * 1000,
                )
            if self.d.settings.group_commit:
                # The store write, the index and the publish, shared with concurrent submissions.
                result = _group(self.store)(_Pending(self.d, CreateRequest(job, runs, record)))
                if result.created:
                    return Submitted(job, True, response, tuple(fires), warnings)
            else:
                with self._atomic():
                    result = self.store.create_job(job, runs, record)
                    if result.created:
                        self._announce([(job, runs)])
                if result.created:
                    return Submitted(job, True, response, tuple(fires), warnings)
            return Submitted(result.job, False, result.response, tuple(preview(result.job, now)), warnings)

    async def asubmit(
        self,
        spec: JobSpec | Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
        known_tasks: set[str] | None = None,
        trace: str | None = None,
    ) -> Submitted:
        """`submit` for asyncio code: awaits the same group-committed path on a submission thread
        (`jobq.groupcommit.off_loop`), so the event loop never waits for the store. Concurrent
        `asubmit` calls share store transactions as concurrent threads do. Returns once the job is
        durable; raises what `submit` raises. The current trace span is the submission's parent."""
        from jobq.groupcommit import off_loop

        return await off_loop(
            functools.partial(self.submit, spec, idempotency_key=idempotency_key, known_tasks=known_tasks, trace=trace)
        )

    def _catalogue(self, task: str) -> dict[str, TaskInfo]:
        now = self.clock.now_ms()
        cached = _CATALOGUES.get(self.store)
        if cached is not None and cached[0] > now and task in cached[1]:
            return cached[1]
        catalogue = self.store.task_catalogue()  # all of it: tasks are few, and the next name is likely here
        _CATALOGUES[self.store] = (now + CATALOGUE_TTL_MS, catalogue)
        return catalogue

    def declared(self, tasks: Sequence[str] | None = None) -> dict[str, TaskInfo]:
        """The task catalogue: each task's declaration as the workers that serve it published it
        (those named in `tasks` when given)."""
        return self.store.task_catalogue(tasks)

    def _unserved(self, task: str, catalogue: Mapping[str, TaskInfo], known_tasks: set[str] | None) -> tuple[str, ...]:
        """A warning when no worker has published or registered `task` (none when one has);
        raises `UnknownTask` under the setting `unknown_tasks = "refuse"`."""
        from jobq.submission import unknown_task_message

        if known_tasks is not None or task in catalogue:
            return ()  # an explicit set is checked by build_job
        registered = self.store.known_tasks()
        if task in registered:
            return ()
        if self.d.settings.unknown_tasks == "refuse":
            raise UnknownTask(unknown_task_message(task, registered | set(self.declared())), field="target.task")
        return (f"no worker has served task {task!r} yet: the job waits until one that serves it starts",)

    def submit_many(
        self, specs: Sequence[JobSpec | Mapping[str, Any]], *, known_tasks: set[str] | None = None
    ) -> builtins.list[Job]:
        """Submit many jobs in one store batch (no idempotency keys): the bulk path for backfills
        and fan-outs. Every spec is parsed and validated first, so one bad spec writes nothing
        (`InvalidJob` naming its index). Tasks' declared options apply as in `submit` (one catalogue
        read for the batch). Returns the jobs created."""
        from jobq.submission import JobSpec, build_job, with_declared

        now = self.clock.now_ms()
        items: builtins.list[tuple[Job, builtins.list[Run]]] = []
        catalogue: dict[str, TaskInfo] | None = None
        for i, given in enumerate(specs):
            try:
                spec = JobSpec.parse(given, tenant_id=self.tenant_id)
                if self.tenant_id is not None and spec.tenant_id != self.tenant_id:
                    raise InvalidJob(f"tenant_id {spec.tenant_id!r} is not this token's tenant", field="tenant_id")
                if isinstance(spec.target, TaskTarget):
                    if catalogue is None:
                        catalogue = self.declared()
                    spec = with_declared(spec, catalogue.get(spec.target.task))
                job, runs, _ = build_job(spec, now, self.limits, known_tasks, tracing.current_traceparent())
            except InvalidJob as exc:
                raise InvalidJob(f"specs[{i}]: {exc.message}", field=exc.field) from None
            if job.schedule.type is ScheduleType.IMMEDIATE:
                runs = [self._dispatched(run, now) for run in runs]
            items.append((job, runs))
        with self._atomic():
            created = self.store.create_jobs(items)
            made = [(job, runs) for (job, runs), ok in zip(items, created, strict=True) if ok]
            self._announce(made)
        return [job for job, _ in made]

    def _atomic(self) -> contextlib.AbstractContextManager[None]:
        """The deployment's one transaction for a job's rows and its messages (`Deployment.atomic`),
        where it has one."""
        return self.d.atomic() if self.d.atomic is not None else contextlib.nullcontext()

    def _announce(self, made: Sequence[tuple[Job, Sequence[Run]]]) -> None:
        """After jobs are stored: their scheduled runs into the index (one call), their dispatched
        runs to the broker (one publish per queue)."""
        self._index([run for _, runs in made for run in runs])
        by_queue: dict[str, builtins.list[tuple[Job, Run]]] = {}
        for job, runs in made:
            for run in runs:
                if run.state is RunState.DISPATCHED:
                    by_queue.setdefault(run.priority.queue, []).append((job, run))
        for pairs in by_queue.values():
            self._publish_pairs(pairs)

    def _dispatched(self, run: Run, now: int) -> Run:
        """An instant run skips the time index and the scanner: it is created already dispatched
        (fence 1, as a claim would leave it) under a schedule-to-start lease, and published once
        stored. Should this process die before publishing, the lease runs out and the reaper
        dispatches the run again (fence+1)."""
        lease_ms = round(self.d.settings.schedule_to_start_s * 1000)
        return run.model_copy(
            update={
                "state": RunState.DISPATCHED,
                "fence": 1,
                "lease_owner": _SUBMITTER,
                "lease_expires_ms": now + lease_ms,
                "dispatched_ms": now,
            }
        )

    def _publish_pairs(self, pairs: Sequence[tuple[Job, Run]]) -> None:
        """Publish runs dispatched at submission (all of one priority); if the broker refuses, hand
        them to the scanner instead."""
        if not pairs:
            return
        runs = [run for _, run in pairs]
        try:
            now = self.clock.now_ms()
            bodies = [encode(envelope_for(r, j, trace=tracing.dispatch_trace(r, now))) for j, r in pairs]
            self.d.transport.publish(runs[0].priority.queue, bodies)
        except TransportError:
            # The broker refused: hand the runs to the scanner, which publishes when it can.
            now = self.clock.now_ms()
            back = self.store.transition(
                [
                    Transition(
                        r.run_id,
                        frozenset({RunState.DISPATCHED}),
                        RunState.SCHEDULED,
                        r.fence,
                        {"lease_owner": None, "lease_expires_ms": None, "dispatched_ms": None},
                        at_ms=now,
                    )
                    for r in runs
                ]
            )
            self._index([r for r in back if r is not None])

    # -- reading --------------------------------------------------------------------------------

    def key(self, job: JobRef) -> JobKey:
        """The key `job` names: a `JobKey` as it is; a string as `JobKey.parse` reads it, in this
        client's tenant (or `default`)."""
        if isinstance(job, JobKey):
            return job
        return JobKey.parse(job, self.tenant_id or DEFAULT_TENANT)

    def job(self, job: JobRef) -> Job:
        key = self.key(job)
        # No job can have an id with text no store can compare (NUL, lone surrogates), and
        # PostgreSQL cannot even look one up: such a reference names nothing.
        unreadable = text_problem(key.job_id) is not None or text_problem(key.tenant_id) is not None
        mine = self.tenant_id in (None, key.tenant_id)
        found = None if unreadable or not mine else self.store.get_jobs([key]).get(key)
        if found is None:
            raise JobNotFound(str(key) if self.tenant_id is None else key.job_id)
        return found

    def get(self, job: JobRef) -> JobView:
        from jobq.submission import preview

        found = self.job(job)
        key = found.key
        counts = {state.value: n for state, n in self.store.run_counts(key).items()}
        newest = self.store.list_runs(RunQuery(job=key, limit=1)).items
        current = _current([*self._open_runs(key), *newest])
        now = self.clock.now_ms()
        # Only an ACTIVE job has a next run time: a paused one starts nothing until it is resumed (the
        # due time of a run held for it is when the scanner looks at the job again, not a time it runs).
        upcoming: builtins.list[int] = []
        if found.corrupt is not None:
            pass  # its schedule may be what does not decode: nothing is promised
        elif found.status is JobStatus.ACTIVE:
            if found.recurring:
                upcoming = preview(found, now)
            elif current is not None and not current.state.terminal and not current.held:
                upcoming = [current.due_ms]
            elif found.next_fire_ms is not None:
                upcoming = [found.next_fire_ms]  # a one-off beyond the horizon: its run is not created yet
        return JobView(found, current, counts, tuple(upcoming))

    def list(self, query: JobQuery) -> Page[Job]:
        if self.tenant_id is not None:
            query = dataclasses.replace(query, tenant_id=self.tenant_id)
        return self.store.list_jobs(query)

    def outcomes(self, jobs: Sequence[Job]) -> dict[JobKey, str]:
        """`FAILED` for each COMPLETED one-off (or immediate) job among `jobs` whose run failed (it
        was dead-lettered): its record says COMPLETED because nothing more will run, but users
        need its outcome. One batch read of those jobs' runs."""
        done = {
            Run.make_id(j.key, j.schedule.at_ms): j.key
            for j in jobs
            if j.status is JobStatus.COMPLETED and not j.recurring and j.schedule.at_ms is not None
        }
        runs = self.store.get_runs(builtins.list(done)) if done else {}
        return {key: "FAILED" for run_id, key in done.items() if (r := runs.get(run_id)) and r.state is RunState.FAILED}

    def runs(self, job: JobRef, *, cursor: str | None = None, limit: int = 100) -> Page[Run]:
        key = self.job(job).key
        return self.store.list_runs(RunQuery(job=key, cursor=cursor, limit=limit))

    def run(self, run_id: str) -> Run:
        if text_problem(run_id) is not None:
            raise RunNotFound(run_id)
        run = self.store.get_runs([run_id]).get(run_id)
        if run is None or (self.tenant_id is not None and run.tenant_id != self.tenant_id):
            raise RunNotFound(run_id)
        return run

    def history(self, job: JobRef, limit: int = 1000) -> builtins.list[RunEvent]:
        key = self.job(job).key
        return self.d.history.read(key, limit)

    def wait(self, job: JobRef, *, timeout_s: float = 30.0, poll_s: float = 0.05) -> Run:
        """Block until the job's current run is terminal; returns it. Raises TimeoutError."""
        deadline = time.monotonic() + timeout_s
        while True:
            view = self.get(job)
            run = view.current_run
            if run is not None and run.state.terminal:
                return run
            if time.monotonic() > deadline:
                state = run.state if run else "no run yet"
                raise TimeoutError(f"job {job} did not finish within {timeout_s} s (current run: {state})")
            time.sleep(poll_s)

    def run_result(self, run_id: str) -> RunResult:
        """The run's result as it stands now (PENDING while it has not finished). Raises RunNotFound."""
        return read_result(self.run(run_id), self.clock.now_ms(), self.d.settings.result_ttl_s)

    def result(self, run_id: str, *, timeout_s: float | None = 30.0) -> Any:
        """The run's return value, waiting up to `timeout_s` seconds for it to finish (None: as long as
        it takes; 0: not at all). A run waiting to retry has not finished: its final outcome counts.

        Raises `TaskFailed` (the final error's type and message), `TaskCancelled`, `ResultExpired`,
        `ResultNotKept`, `ResultTimeout` (also a `TimeoutError`), `RunNotFound`."""
        return self.wait_result(run_id, timeout_s=timeout_s).unwrap()

    def wait_result(self, run_id: str, *, timeout_s: float | None = 30.0) -> RunResult:
        """Poll the run (one read by id) until it finishes: every 20 ms at first, backing off to 0.5 s,
        so a short task answers fast and a long wait costs two reads a second. Raises `ResultTimeout`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pause = 0.02
        while True:
            found = self.run_result(run_id)
            if found.state is not ResultState.PENDING:
                return found
            if deadline is not None and time.monotonic() >= deadline:
                raise ResultTimeout(run_id, timeout_s or 0.0, self.run(run_id).state.value)
            wait = pause if deadline is None else min(pause, max(0.0, deadline - time.monotonic()))
            time.sleep(wait)
            pause = min(pause * 1.5, 0.5)

    def current_run_id(self, job: JobRef) -> str | None:
        """The id of the run a user means by "the job's run" (`get`'s current run), if any yet."""
        run = self.get(job).current_run
        return None if run is None else run.run_id

    # -- changing -------------------------------------------------------------------------------

    def cancel(self, job: JobRef) -> Job:
        """Cancel the job and every run not yet finished. Linearizable: once this returns, no run of
        the job starts, and a running one sees `ctx.cancelled` at its next heartbeat (its outcome
        is refused). Cancelling a cancelled job finishes what an interrupted cancel left. A
        quarantined job, or one whose record does not decode, can be cancelled too."""
        allowed = {JobStatus.ACTIVE, JobStatus.PAUSED, JobStatus.CANCELLED, JobStatus.QUARANTINED}
        cancelled = self._set_status(job, allowed, JobStatus.CANCELLED, next_fire_ms=None)
        now = self.clock.now_ms()

        def end(run: Run) -> Transition | None:
            return Transition(
                run.run_id,
                frozenset({run.state}),
                RunState.CANCELLED,
                run.fence if run.corrupt is None else None,  # a corrupt row's fence may be what is wrong
                {"last_error": "cancelled by request", "finished_ms": now, "lease_expires_ms": None},
                bump_fence=True,
                at_ms=now,
            )

        self._override(cancelled.key, end)
        return cancelled

    def pause(self, job: JobRef) -> Job:
        """Stop creating runs, and hold the runs not yet started until `resume`. Linearizable: once
        this returns, no run of the job starts until it is resumed (a running one finishes)."""
        now = self.clock.now_ms()
        paused = self._set_status(job, {JobStatus.ACTIVE}, JobStatus.PAUSED, paused_ms=now)

        def hold(run: Run) -> Transition | None:
            # A SCHEDULED run is safe where it is: whoever claims it reads the job's status first.
            # A claimed or dispatched one already passed that check: fence it off and put it back.
            if run.state not in (RunState.CLAIMED, RunState.DISPATCHED):
                return None
            return Transition(
                run.run_id,
                frozenset({run.state}),
                RunState.SCHEDULED,
                run.fence,
                {
                    "due_ms": now + PAUSED_RECHECK_MS,
                    "lease_owner": None,
                    "lease_expires_ms": None,
                    "blocked_by": PAUSED,
                },
                bump_fence=True,
                at_ms=now,
            )

        self._override(paused.key, hold)
        return paused

    def resume(self, job: JobRef) -> Job:
        """Create runs again. Recurring fires that fell in the pause are skipped; a one-off fires now.
        A quarantined job is resumed the same way once its record decodes again."""
        from jobq.submission import resume_fire

        now = self.clock.now_ms()
        current = self.job(job)
        key = current.key
        if current.corrupt is not None:
            raise Conflict(f"job {self._name(current)!r} does not decode ({current.corrupt}); repair its record first")
        paused_ms = current.paused_ms
        resumed = self._set_status(
            key,
            {JobStatus.PAUSED, JobStatus.QUARANTINED},
            JobStatus.ACTIVE,
            next_fire_ms=resume_fire(current, now),
            paused_ms=None,
        )

        def wake(run: Run) -> Transition | None:
            if run.state is not RunState.SCHEDULED or run.blocked_by != PAUSED:
                return None
            fell_in_pause = paused_ms is not None and paused_ms <= run.nominal_ms < now
            if resumed.recurring and run.attempt == 1 and fell_in_pause:
                return Transition(
                    run.run_id,
                    frozenset({RunState.SCHEDULED}),
                    RunState.CANCELLED,
                    run.fence,
                    {"last_error": "skipped: due while the job was paused", "finished_ms": now, "blocked_by": None},
                    bump_fence=True,
                    at_ms=now,
                )
            return Transition(
                run.run_id,
                frozenset({RunState.SCHEDULED}),
                RunState.SCHEDULED,
                run.fence,
                {"due_ms": max(run.nominal_ms, now), "blocked_by": None},
                at_ms=now,
            )

        self._override(key, wake, states=frozenset({RunState.SCHEDULED}))
        return self._materialise(resumed)

    def trigger(self, job: JobRef) -> Run:
        """Run the job once now, outside its schedule (its policies and payload apply). The run
        never completes the job: a one-off still fires at its own time."""
        from jobq.submission import new_run

        found = self.job(job)
        name = self._name(found)
        if found.corrupt is not None:
            raise Conflict(f"job {name!r} does not decode ({found.corrupt}); cancel it or repair its record")
        if found.status in (JobStatus.CANCELLED, JobStatus.QUARANTINED):
            raise Conflict(f"job {name!r} is {found.status.value.lower()}")
        now = self.clock.now_ms()
        # A trigger is an action of its own: it continues the caller's trace, or starts one.
        trace = tracing.current_traceparent() or tracing.fire_trace(found, now)
        run = new_run(found, now, now, self.limits, trace=trace)
        added = self.store.add_runs([run])
        if not added:
            raise Conflict(f"job {name!r} was already triggered at {now}")
        self._index(added)
        return added[0]

    # -- dead letters ---------------------------------------------------------------------------

    def dead_letters(self, *, cursor: str | None = None, limit: int = 100) -> Page[Run]:
        return self.store.list_runs(RunQuery(tenant_id=self.tenant_id, dead_letter=True, cursor=cursor, limit=limit))

    def redrive(self, run_id: str) -> Run:
        """Schedule a dead-lettered run again now, as attempt N+1 with a fresh attempt budget: up to
        `retry.max_attempts` attempts from this one (`attempt_base` = N)."""
        run = self.run(run_id)
        if not run.dead_letter:
            raise Conflict(f"run {run_id!r} is not on the dead-letter list")
        now = self.clock.now_ms()
        t = Transition(
            run_id,
            frozenset({RunState.FAILED}),
            RunState.SCHEDULED,
            run.fence,
            {
                "dead_letter": False,
                "attempt": run.attempt + 1,
                "attempt_base": run.attempt,
                "due_ms": now,
                "deadline_ms": None,
                "finished_ms": None,
                "lease_owner": None,
                "lease_expires_ms": None,
            },
            at_ms=now,
            job_status=JobStatus.ACTIVE,
        )
        [moved] = self.store.transition([t])
        if moved is None:
            raise Conflict(f"run {run_id!r} changed while being redriven; try again")
        self._index([moved])
        return moved

    def purge(self, run_ids: Sequence[str] | None = None) -> int:
        """Take runs off the dead-letter list (all of this tenant's when `run_ids` is None)."""
        if run_ids is None:
            targets: builtins.list[Run] = []
            cursor = None
            while True:
                page = self.dead_letters(cursor=cursor, limit=500)
                targets.extend(page.items)
                if page.next_cursor is None:
                    break
                cursor = page.next_cursor
        else:
            targets = [self.run(i) for i in run_ids]
        now = self.clock.now_ms()
        moved = self.store.transition(
            [
                Transition(
                    r.run_id, frozenset({RunState.FAILED}), RunState.FAILED, r.fence, {"dead_letter": False}, at_ms=now
                )
                for r in targets
                if r.dead_letter
            ]
        )
        return sum(1 for m in moved if m is not None)

    # -- helpers --------------------------------------------------------------------------------

    def _name(self, job: Job) -> str:
        """The job as messages name it: its id to a client of its tenant, else `TENANT/JOB_ID`."""
        return job.job_id if self.tenant_id is not None else str(job.key)

    def _open_runs(self, job: JobKey, states: frozenset[RunState] = _OPEN) -> builtins.list[Run]:
        """The job's unfinished runs: few, since runs are only created within the horizon."""
        runs: builtins.list[Run] = []
        cursor = None
        while True:
            page = self.store.list_runs(RunQuery(job=job, states=states, cursor=cursor, limit=500))
            runs.extend(page.items)
            if page.next_cursor is None:
                return runs
            cursor = page.next_cursor

    def _set_status(self, ref: JobRef, allowed: set[JobStatus], status: JobStatus, **fields: int | None) -> Job:
        """Move the job to `status` (and set `fields`) by compare-and-set on its version, reading it
        again when beat advanced it meanwhile. The status reason a daemon left goes. A job whose
        record does not decode can only be cancelled: a status write that leaves the record as it is."""
        for _ in range(5):
            job = self.job(ref)
            name = self._name(job)
            if job.status not in allowed:
                raise Conflict(f"job {name!r} is {job.status}; cannot make it {status}")
            now = self.clock.now_ms()
            if job.corrupt is not None:
                if status is not JobStatus.CANCELLED:
                    raise Conflict(f"job {name!r} does not decode ({job.corrupt}); cancel it or repair its record")
                if self.store.set_job_status(job.key, status, frozenset(allowed), now):
                    changed = {"status": status, "status_reason": None, "version": job.version + 1, "updated_ms": now}
                    return job.model_copy(update=changed)
                continue
            update: dict[str, object] = {"status": status, "status_reason": None, "updated_ms": now, **fields}
            try:
                return self.store.update_job(job.model_copy(update=update))
            except Conflict:
                continue  # beat advanced it meanwhile; read again
        raise Conflict(f"job {str(self.key(ref))!r} keeps changing; try again")

    def _override(
        self,
        job: JobKey,
        decide: Callable[[Run], Transition | None],
        *,
        states: frozenset[RunState] = _OPEN,
        rounds: int = 50,
    ) -> None:
        """Apply `decide` to the job's open runs until it has nothing left to do: every write is a
        fenced compare-and-set, and one that loses (a daemon moved the run meanwhile) is decided
        again from the run as it now is. The job's status was changed first, so daemons that read
        it from then on act on it themselves, and the loop ends."""
        for _ in range(rounds):
            moves = [m for m in map(decide, self._open_runs(job, states)) if m is not None]
            if not moves:
                return
            moved = self.store.transition(moves)
            done = [r for r in moved if r is not None]
            self.d.index.discard([r.run_id for r in done if r.state is not RunState.SCHEDULED])
            self._index([r for r in done if r.state is RunState.SCHEDULED])
        raise Conflict(f"job {str(job)!r}: its runs keep changing; try again")

    def _materialise(self, job: Job) -> Job:
        from jobq.submission import materialise

        now = self.clock.now_ms()
        advanced, runs, _ = materialise(job, now, self.limits)
        if not runs:
            return job
        self.store.add_runs(runs)
        self._index(runs)
        try:
            return self.store.update_job(advanced)
        except Conflict:
            return self.job(job.key)  # beat got there first; its runs are the same runs

    def _index(self, runs: Sequence[Run]) -> None:
        entries = [IndexEntry(r.run_id, r.due_ms, r.priority) for r in runs if r.state is RunState.SCHEDULED]
        if entries:
            self.d.index.add(entries)


@dataclass(frozen=True, slots=True)
class _Pending:
    """A submission waiting for its group's commit, with the deployment to index and publish it in."""

    d: Deployment
    request: CreateRequest


_GROUPS: weakref.WeakKeyDictionary[object, GroupCommit[_Pending, CreateResult]] = weakref.WeakKeyDictionary()
_GROUPS_LOCK = threading.Lock()


def _group(store: object) -> GroupCommit[_Pending, CreateResult]:
    """The group commit of `store`, shared by every client of this process (the API builds one
    client per request). It holds no deployment: each item brings its own."""
    with _GROUPS_LOCK:
        group = _GROUPS.get(store)
        if group is None:
            # How many groups may commit at once: a store whose writers take turns (SQLite) gains
            # nothing from more than one; a server (PostgreSQL) commits several in parallel.
            parallel = getattr(store, "concurrent_groups", 1)
            group = _GROUPS[store] = GroupCommit(_commit_group, _announce_group, parallel=parallel)
        return group


def _commit_group(pending: builtins.list[_Pending]) -> builtins.list[CreateResult | JobqError]:
    """One group's store write: every request in one transaction (`JobStore.create_job_group`).
    When the deployment is one SQLite file, the runs' index entries and messages are written in the
    same transaction (`Deployment.atomic`): one commit instead of two, and a job is never stored
    without its messages; an index or publish failure then fails the whole group, nothing written."""
    d = pending[0].d
    if d.atomic is None:
        return d.store.create_job_group([p.request for p in pending])
    with d.atomic():
        outcomes = d.store.create_job_group([p.request for p in pending])
        for indices in _created(pending, outcomes).values():
            Client(pending[indices[0]].d)._announce(
                [(pending[i].request.job, pending[i].request.runs) for i in indices]
            )
    return outcomes


def _created(pending: Sequence[_Pending], outcomes: Sequence[object]) -> dict[int, builtins.list[int]]:
    """The indices of the created jobs, by deployment."""
    created: dict[int, builtins.list[int]] = {}
    for i, (item, outcome) in enumerate(zip(pending, outcomes, strict=True)):
        if isinstance(outcome, CreateResult) and outcome.created:
            created.setdefault(id(item.d), []).append(i)
    return created


def _announce_group(
    pending: builtins.list[_Pending], outcomes: builtins.list[CreateResult | BaseException]
) -> builtins.list[CreateResult | BaseException]:
    """After the group's commit, while the next group commits: the created jobs' runs indexed and
    published, one call each per deployment (unless the commit did it: `Deployment.atomic`). A
    caller whose job was stored but whose index or publish failed gets that error, as it would alone."""
    if pending[0].d.atomic is not None:
        return outcomes
    created = _created(pending, outcomes)
    for indices in created.values():
        try:
            made = [(pending[i].request.job, pending[i].request.runs) for i in indices]
            Client(pending[indices[0]].d)._announce(made)
        except Exception as exc:
            for i in indices:
                outcomes[i] = exc
    return outcomes


def _current(runs: Sequence[Run]) -> Run | None:
    """The run a user means by "the job's run": the oldest unfinished one, else the newest."""
    open_runs = [r for r in runs if not r.state.terminal]
    if open_runs:
        return min(open_runs, key=lambda r: r.nominal_ms)
    return max(runs, key=lambda r: r.nominal_ms) if runs else None
