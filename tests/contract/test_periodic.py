"""Declared periodic schedules synced on every store backend: created, left alone, updated, paused
when removed, resumed when declared again; two processes syncing at once make one job; and a
module-level `Task.schedule(job_id=...)` imported twice is the same job."""

from __future__ import annotations

import threading

import pytest
from factories import T0

from jobq.app import App
from jobq.client import Client
from jobq.deployment import Deployment
from jobq.errors import Conflict, DuplicateJob
from jobq.models import JobKey, JobStatus, RunState
from jobq.periodic import REMOVED, Periodic
from jobq.ports import JobQuery, RunQuery
from jobq.submission import JobSpec

from .deployed import deployed  # noqa: F401 - a deployment over the store under test
from .test_store import store  # noqa: F401 - the parametrised fixture over every backend

KEY = JobKey("default", "billing.monthly")


def _app(d: Deployment, *entries: Periodic) -> App:
    app = App("billing", schedules=list(entries), clock=d.clock)
    app.use(d)
    return app


def _jobs(d: Deployment) -> list[str]:
    return sorted(str(j.key) for j in d.store.list_jobs(JobQuery()).items)


def _runs(d: Deployment, state: RunState | None = None) -> list[str]:
    states = frozenset({state}) if state is not None else frozenset()
    return sorted(r.run_id for r in d.store.list_runs(RunQuery(job=KEY, states=states)).items)


MONTHLY = Periodic("billing.invoice", cron="0 2 1 * *", tz="America/New_York", name="monthly")
EVERY_SECOND = Periodic("billing.invoice", cron="* * * * * *", name="monthly", args=(1,))


def test_a_declared_schedule_is_created_once_and_then_left_alone(deployed: Deployment) -> None:  # noqa: F811
    app = _app(deployed, MONTHLY)
    assert app.sync_schedules().created == [str(KEY)]
    job = deployed.store.get_jobs([KEY])[KEY]
    assert (job.declared_by, job.schedule.cron, job.schedule.timezone) == ("billing", "0 2 1 * *", "America/New_York")
    again = _app(deployed, MONTHLY).sync_schedules()  # a second worker starting
    assert (again.created, again.unchanged) == ([], [str(KEY)])
    assert _jobs(deployed) == [str(KEY)]
    assert deployed.store.get_jobs([KEY])[KEY].version == job.version


def test_a_changed_schedule_is_updated_in_place_and_its_old_unstarted_runs_cancelled(
    deployed: Deployment,  # noqa: F811
) -> None:
    _app(deployed, EVERY_SECOND).sync_schedules()
    old_runs = _runs(deployed, RunState.SCHEDULED)
    assert old_runs, "a per-second cron has runs within the horizon"
    deployed.clock.advance(s=0.5)
    changed = Periodic("billing.invoice", cron="*/2 * * * * *", name="monthly", args=(2,))
    assert _app(deployed, changed).sync_schedules().updated == [str(KEY)]
    job = deployed.store.get_jobs([KEY])[KEY]
    assert (job.schedule.cron, job.payload["args"], job.status) == ("*/2 * * * * *", [2], JobStatus.ACTIVE)
    assert _jobs(deployed) == [str(KEY)]
    runs = {r.run_id: r for r in deployed.store.list_runs(RunQuery(job=KEY)).items}
    scheduled = [r for r in runs.values() if r.state is RunState.SCHEDULED]
    assert all((r.nominal_ms // 1000) % 2 == 0 for r in scheduled), "only the new schedule's fires wait"
    odd = [i for i in old_runs if (runs[i].nominal_ms // 1000) % 2 == 1]
    assert odd and all(runs[i].state is RunState.CANCELLED for i in odd)
    newest = max(scheduled, key=lambda r: r.nominal_ms)
    assert job.last_run_id == newest.run_id and job.next_fire_ms is not None and job.next_fire_ms > newest.nominal_ms


def test_a_removed_schedule_is_paused_and_resumed_when_declared_again(deployed: Deployment) -> None:  # noqa: F811
    _app(deployed, MONTHLY).sync_schedules()
    assert _app(deployed).sync_schedules().paused == [str(KEY)]
    job = deployed.store.get_jobs([KEY])[KEY]
    assert job.status is JobStatus.PAUSED and job.status_reason == REMOVED + "billing"
    assert _app(deployed).sync_schedules().paused == []  # already paused
    assert _app(deployed, MONTHLY).sync_schedules().resumed == [str(KEY)]
    assert deployed.store.get_jobs([KEY])[KEY].status is JobStatus.ACTIVE


def test_a_job_paused_or_cancelled_by_a_user_is_not_brought_back(deployed: Deployment) -> None:  # noqa: F811
    app = _app(deployed, MONTHLY)
    app.sync_schedules()
    Client(deployed).pause(KEY)
    assert app.sync_schedules().unchanged == [str(KEY)]
    assert deployed.store.get_jobs([KEY])[KEY].status is JobStatus.PAUSED
    Client(deployed).cancel(KEY)
    assert app.sync_schedules().left_alone == [str(KEY)]
    assert deployed.store.get_jobs([KEY])[KEY].status is JobStatus.CANCELLED


def test_another_apps_jobs_and_undeclared_jobs_are_never_paused(deployed: Deployment) -> None:  # noqa: F811
    client = Client(deployed)
    spec = {"job_id": "billing.handmade", "schedule_type": "CRON", "cron_expression": "0 * * * *"}
    client.submit(JobSpec.model_validate({**spec, "target": {"type": "TASK", "task": "t"}}))
    other = App("billing2", schedules=[MONTHLY], clock=deployed.clock)
    other.use(deployed)
    other.sync_schedules()
    assert _app(deployed).sync_schedules().paused == []
    statuses = {str(j.key): j.status for j in deployed.store.list_jobs(JobQuery()).items}
    assert statuses == {"billing.handmade": JobStatus.ACTIVE, "billing2.monthly": JobStatus.ACTIVE}


def test_a_declared_id_taken_by_a_job_submitted_otherwise_is_a_clear_conflict(
    deployed: Deployment,  # noqa: F811
) -> None:
    spec = {"job_id": "billing.monthly", "schedule_type": "CRON", "cron_expression": "0 * * * *"}
    Client(deployed).submit(JobSpec.model_validate({**spec, "target": {"type": "TASK", "task": "t"}}))
    with pytest.raises(Conflict, match="not a declared schedule of app 'billing'"):
        _app(deployed, MONTHLY).sync_schedules()


def test_two_processes_syncing_at_once_make_one_job(deployed: Deployment) -> None:  # noqa: F811
    barrier = threading.Barrier(4)
    reports = []

    def start_worker() -> None:
        app = _app(deployed, MONTHLY)
        barrier.wait()
        reports.append(app.sync_schedules())

    threads = [threading.Thread(target=start_worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(len(r.created) for r in reports) == [0, 0, 0, 1]
    assert _jobs(deployed) == [str(KEY)]


def test_scheduling_a_job_id_again_with_an_equal_spec_is_the_same_job(deployed: Deployment) -> None:  # noqa: F811
    def import_module() -> str:
        app = App("billing", clock=deployed.clock)
        app.use(deployed)

        @app.task(name="billing.invoice")
        def invoice(n: int) -> None: ...

        return invoice.schedule(cron="0 2 1 * *", tz="America/New_York", args=(42,), job_id="monthly-42").job_id

    assert import_module() == import_module() == "monthly-42"
    assert _jobs(deployed) == ["monthly-42"]


def test_scheduling_a_job_id_again_with_another_spec_says_it_differs(deployed: Deployment) -> None:  # noqa: F811
    app = App("billing", clock=deployed.clock)
    app.use(deployed)

    @app.task(name="billing.invoice")
    def invoice(n: int) -> None: ...

    invoice.schedule(cron="0 2 1 * *", args=(42,), job_id="monthly-42")
    with pytest.raises(DuplicateJob, match="different spec"):
        invoice.schedule(cron="0 3 1 * *", args=(42,), job_id="monthly-42")
    assert deployed.clock.now_ms() == T0
