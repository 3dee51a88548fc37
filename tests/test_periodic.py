"""`@app.periodic` and `App(schedules=...)`: declared where the code is, checked when declared."""

from __future__ import annotations

import pytest

from jobq import App, InvalidJob, Periodic, Priority, RetryPolicy
from jobq.clock import ManualClock
from jobq.models import JobKey


def test_periodic_registers_the_task_and_declares_its_schedule() -> None:
    app = App("billing")

    @app.periodic(cron="0 2 1 * *", tz="America/New_York", args=(7,))
    def monthly(cycle: int) -> int:
        return cycle

    assert app.registry.names() == {monthly.name}
    [entry] = app.schedules
    assert (entry.task, entry.cron, entry.tz, tuple(entry.args)) == (
        monthly.name,
        "0 2 1 * *",
        "America/New_York",
        (7,),
    )
    assert entry.spec(app.name).job_id == f"billing.{monthly.name.replace('<locals>', '_locals_')}"
    assert monthly(3) == 3  # still callable here


def test_periodic_on_a_registered_task_declares_it_again_under_another_name() -> None:
    app = App("billing")

    @app.task(name="billing.report")
    def report(kind: str) -> None: ...

    app.periodic(cron="0 * * * *", args=("hourly",), name="hourly-report")(report)
    app.periodic(cron="0 0 * * *", args=("daily",), name="daily-report")(report)
    assert [e.spec(app.name).job_id for e in app.schedules] == ["billing.hourly-report", "billing.daily-report"]


def test_a_bad_cron_is_refused_when_declared_naming_the_argument() -> None:
    app = App("billing")
    with pytest.raises(InvalidJob) as caught:

        @app.periodic(cron="61 * * * *")
        def broken() -> None: ...

    assert "cron" in str(caught.value)
    assert app.schedules == []


def test_two_entries_with_one_name_are_refused() -> None:
    with pytest.raises(InvalidJob, match="distinct name"):
        App("billing", schedules=[Periodic("t.a", cron="@hourly"), Periodic("t.a", cron="@daily")])


def test_an_unknown_timezone_in_schedules_fails_when_the_app_is_built() -> None:
    with pytest.raises(InvalidJob, match="tz"):
        App("billing", schedules=[Periodic("t.a", cron="@hourly", tz="Mars/Olympus")])


def test_sync_schedules_on_the_embedded_store(clock: ManualClock) -> None:
    app = App("billing", store="memory://", clock=clock, schedules=[Periodic("t.a", cron="@hourly")])
    try:
        assert app.sync_schedules().created == ["billing.t.a"]
        assert app.sync_schedules().unchanged == ["billing.t.a"]
    finally:
        app.close()


def test_an_entry_takes_its_tasks_declared_priority_retry_and_timeout(clock: ManualClock) -> None:
    app = App("billing", store="memory://", clock=clock, schedules=[Periodic("billing.report", cron="@hourly")])
    try:

        @app.task(name="billing.report", priority="HIGH", retry=RetryPolicy(max_retries=1), timeout_s=30)
        def report() -> None: ...

        @app.periodic(cron="@daily", priority="CRITICAL")
        def close_books() -> None: ...

        app.sync_schedules()
        jobs = app.client.store.get_jobs([JobKey("default", "billing.billing.report")])
        job = jobs[JobKey("default", "billing.billing.report")]
        assert (job.priority, job.retry.max_retries, job.timeout_s) == (Priority.HIGH, 1, 30)
        assert app.registry.get(close_books.name).priority is Priority.CRITICAL  # type: ignore[union-attr]
    finally:
        app.close()
