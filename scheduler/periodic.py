"""Declared periodic tasks: schedules that live in code, synced to the store when workers or beat start.

    @app.periodic(cron="0 2 1 * *", tz="America/New_York")
    def monthly_billing() -> None: ...

    app = App("billing", schedules=[Periodic("billing.report", cron="0 * * * *", args=(7,))])

Each entry is a cron job whose id is `<app name>.<entry name>` (the entry name defaults to the task
name) and which is marked as declared by the app (`Job.declared_by`). `sync` makes the store agree
with the code, idempotently:

- absent: created;
- present with the same spec (`Job.spec_fingerprint`): left alone (resumed if a previous sync had
  paused it as removed);
- present with another spec: updated in place (same job id, compare-and-set on its version); runs
  of the old schedule that have not started are cancelled, those of the new one created;
- a job this app declared that is no longer declared: paused, with the reason `REMOVED`. It is
  found by its id prefix `<app name>.` in the tenants the app's entries use (and `default`).

Two processes syncing at once converge: creation is conditional on the id, updates on the version,
and a loser reads the job again and finds it equal. A job the user cancelled stays cancelled; one
the user paused stays paused (its spec is still updated).
"""

from __future__ import annotations

import builtins
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobq.errors import Conflict, DuplicateJob, InvalidJob
from jobq.models import (
    DstGap,
    DstOverlap,
    Job,
    JobKey,
    JobStatus,
    MisfirePolicy,
    OverlapPolicy,
    Priority,
    RetryPolicy,
    RunState,
    Transition,
)
from jobq.ports import IndexEntry, JobQuery, RunQuery
from jobq.schedules import parse_cron, zone
from jobq.submission import JobSpec, build_job, materialise
from jobq.tasks import TaskDef, TaskRegistry

if TYPE_CHECKING:
    from jobq.client import Client

log = logging.getLogger("jobq.periodic")

#: The status reason of a declared job paused because its app no longer declares it.
REMOVED = "REMOVED: no longer declared by app "
_ROUNDS = 8  # reads again after losing a race to another syncing process

# The argument of `Periodic` that sets each JobSpec field, for error messages.
_ARGUMENTS = {
    "job_id": "name",
    "cron_expression": "cron",
    "timezone": "tz",
    "payload": "args/kwargs",
    "retry_policy": "retry",
    "catchup_window_seconds": "catchup_window_s",
    "jitter_seconds": "jitter_s",
    "misfire_policy": "misfire",
    "overlap_policy": "overlap",
}


@dataclass(frozen=True)
class Periodic:
    """One declared schedule: run `task` (a registered task's name) on `cron` in `tz`."""

    task: str
    cron: str
    tz: str = "UTC"
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] | None = None
    name: str | None = None  # the entry's name, unique in its app: the job id is `<app>.<name>`
    priority: Priority | str | None = None
    retry: RetryPolicy | None = None
    timeout_s: float | None = None
    tenant_id: str = "default"
    misfire: MisfirePolicy | str = MisfirePolicy.FIRE_ONCE_NOW
    catchup_window_s: int = 86_400
    overlap: OverlapPolicy | str = OverlapPolicy.SKIP
    jitter_s: int = 0
    dst_gap: DstGap | str = DstGap.SKIP
    dst_overlap: DstOverlap | str = DstOverlap.ONCE

    @property
    def entry_name(self) -> str:
        """`name`, else the task's name with what a job id cannot hold (`<locals>`) replaced."""
        return self.name or re.sub(r"[^A-Za-z0-9_.\-]", "_", self.task).lstrip("_.-")

    def spec(self, app_name: str, task: TaskDef | None = None) -> JobSpec:
        """The job this entry declares for app `app_name`, with its cron and timezone checked. The
        priority, retry policy and timeout the entry leaves unset are the task's (`task`, its
        registration), else the defaults. Raises `InvalidJob` naming the argument."""
        spec = JobSpec.parse(
            {
                "tenant_id": self.tenant_id,
                "job_id": f"{app_name}.{self.entry_name}",
                "job_name": self.entry_name,
                "schedule_type": "CRON",
                "cron_expression": self.cron,
                "timezone": self.tz,
                "priority": self.priority or (task.priority if task is not None else Priority.DEFAULT),
                "target": {"type": "TASK", "task": self.task},
                "payload": {"args": list(self.args), "kwargs": dict(self.kwargs or {})},
                "retry_policy": self.retry or (task.retry if task is not None else None) or RetryPolicy(),
                "misfire_policy": self.misfire,
                "catchup_window_seconds": self.catchup_window_s,
                "overlap_policy": self.overlap,
                "jitter_seconds": self.jitter_s,
                "dst_gap": self.dst_gap,
                "dst_overlap": self.dst_overlap,
                "timeout_seconds": self.timeout_s if self.timeout_s is not None or task is None else task.timeout_s,
            },
            names=_ARGUMENTS,
        )
        try:
            zone(spec.timezone)
            parse_cron(spec.cron_expression or "", spec.cron_dialect, job_id=spec.job_id)
        except InvalidJob as exc:
            argument = _ARGUMENTS.get(exc.field or "", exc.field)
            raise InvalidJob(f"{argument}: {exc.message}", field=argument) from None
        return spec


def check_entries(app_name: str, entries: Sequence[Periodic], registry: TaskRegistry | None = None) -> list[JobSpec]:
    """Every entry's spec (with its task's registered options, when `registry` has the task);
    raises `InvalidJob` for a bad entry or two entries with one name."""
    specs: list[JobSpec] = []
    seen: set[tuple[str, str | None]] = set()
    for entry in entries:
        spec = entry.spec(app_name, registry.get(entry.task) if registry is not None else None)
        key = (spec.tenant_id, spec.job_id)
        if key in seen:
            raise InvalidJob(
                f"two periodic entries of app {app_name!r} are named {entry.entry_name!r}: give each a distinct name=",
                field="name",
            )
        seen.add(key)
        specs.append(spec)
    return specs


@dataclass
class SyncReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    paused: list[str] = field(default_factory=list)  # removed from the code
    left_alone: list[str] = field(default_factory=list)  # cancelled by a user: not brought back

    def summary(self) -> str:
        parts = [f"{len(v)} {k.replace('_', ' ')}" for k, v in vars(self).items() if v]
        return ", ".join(parts) or "none declared"


def sync(
    client: Client, app_name: str, entries: Sequence[Periodic], registry: TaskRegistry | None = None
) -> SyncReport:
    """Make the store hold exactly the schedules `app_name` declares (module docstring)."""
    specs = check_entries(app_name, entries, registry)
    report = SyncReport()
    for spec in specs:
        _sync_one(client, app_name, spec, report)
    declared = {JobKey(s.tenant_id, s.job_id or "") for s in specs}
    for tenant in sorted({s.tenant_id for s in specs} | {"default"}):
        for job in _declared_jobs(client, app_name, tenant):
            removed = job.key not in declared and job.status is JobStatus.ACTIVE
            if removed and _pause_removed(client, app_name, job.key):
                report.paused.append(str(job.key))
    if report.created or report.updated or report.resumed or report.paused:
        log.info("declared schedules of app %s: %s", app_name, report.summary())
    return report


def _sync_one(client: Client, app_name: str, spec: JobSpec, report: SyncReport) -> None:
    key = JobKey(spec.tenant_id, spec.job_id or "")
    fingerprint = spec.fingerprint()
    for _ in range(_ROUNDS):
        existing = client.store.get_jobs([key]).get(key)
        if existing is None:
            try:
                client.submit(spec, declared_by=app_name)
            except DuplicateJob:
                continue  # another process created it meanwhile: compare with theirs
            report.created.append(str(key))
            return
        if existing.declared_by != app_name:
            raise Conflict(
                f"job {str(key)!r} exists but is not a declared schedule of app {app_name!r}: "
                "cancel it, or rename the periodic entry (name=)"
            )
        if existing.status is JobStatus.CANCELLED:
            report.left_alone.append(str(key))
            return
        removed = existing.status is JobStatus.PAUSED and (existing.status_reason or "").startswith(REMOVED)
        if existing.spec_fingerprint != fingerprint:
            try:
                _update(client, existing, spec, fingerprint, resume=removed)
            except Conflict:
                continue  # beat or another syncing process wrote it meanwhile
            report.updated.append(str(key))
            return
        if removed:
            try:
                client.resume(key)
            except Conflict:
                continue
            report.resumed.append(str(key))
            return
        report.unchanged.append(str(key))
        return
    raise Conflict(f"declared schedule {str(key)!r} keeps changing under the sync; try again")


def _update(client: Client, current: Job, spec: JobSpec, fingerprint: str, *, resume: bool) -> None:
    """Replace the job's definition with `spec`'s (compare-and-set on its version), then cancel the
    old schedule's runs that have not started and create the new one's within the horizon."""
    now = client.clock.now_ms()
    fresh, first_runs, _ = build_job(spec, now, client.limits)
    status = JobStatus.ACTIVE if resume else current.status
    base = fresh.model_copy(
        update={
            "status": status,
            "status_reason": None if resume else current.status_reason,
            "paused_ms": None if status is JobStatus.ACTIVE else current.paused_ms,
            # From the first fire of the new schedule, chained after the job's newest run (overlap).
            "next_fire_ms": first_runs[0].nominal_ms if first_runs else fresh.next_fire_ms,
            "last_run_id": current.last_run_id,
            "created_ms": current.created_ms,
            "version": current.version,
            "declared_by": current.declared_by,
            "spec_fingerprint": fingerprint,
        }
    )
    merged, runs, _ = materialise(base, now, client.limits)
    client.store.update_job(merged)
    keep = {r.run_id for r in runs} if status is JobStatus.ACTIVE else set()
    _cancel_unstarted(client, current.key, keep, now)
    if status is JobStatus.ACTIVE:
        added = client.store.add_runs(runs)
        entries = [IndexEntry(r.run_id, r.due_ms, r.priority) for r in added if r.state is RunState.SCHEDULED]
        if entries:
            client.d.index.add(entries)


def _cancel_unstarted(client: Client, key: JobKey, keep: set[str], now: int) -> None:
    """Cancel the job's SCHEDULED first attempts of fires the new schedule does not have. A run
    already claimed, dispatched or running finishes; a retry of an earlier fire goes on."""
    page = client.store.list_runs(RunQuery(job=key, states=frozenset({RunState.SCHEDULED}), limit=500))
    moves = [
        Transition(
            r.run_id,
            frozenset({RunState.SCHEDULED}),
            RunState.CANCELLED,
            r.fence,
            {"last_error": "its declared schedule changed", "finished_ms": now, "blocked_by": None},
            bump_fence=True,
            at_ms=now,
        )
        for r in page.items
        if r.run_id not in keep and r.attempt == 1 and r.corrupt is None
    ]
    if moves:
        done = [r for r in client.store.transition(moves) if r is not None]
        client.d.index.discard([r.run_id for r in done])


def _declared_jobs(client: Client, app_name: str, tenant: str) -> builtins.list[Job]:
    jobs: builtins.list[Job] = []
    cursor = None
    while True:
        query = JobQuery(tenant_id=tenant, id_prefix=f"{app_name}.", cursor=cursor, limit=500)
        page = client.store.list_jobs(query)
        jobs.extend(j for j in page.items if j.corrupt is None and j.declared_by == app_name)
        if page.next_cursor is None:
            return jobs
        cursor = page.next_cursor


def _pause_removed(client: Client, app_name: str, key: JobKey) -> bool:
    """Pause a job the app no longer declares and say why; False when another process (or a user)
    changed its status first."""
    try:
        paused = client.pause(key)
    except Conflict:
        return False
    for _ in range(_ROUNDS):
        try:
            client.store.update_job(paused.model_copy(update={"status_reason": REMOVED + app_name}))
            return True
        except Conflict:
            paused = client.job(key)  # beat or a run moved its version
            if paused.status is not JobStatus.PAUSED:
                return True
    return True
