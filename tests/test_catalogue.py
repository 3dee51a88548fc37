"""The task catalogue: workers publish the tasks they serve, and every submission by name (CLI,
Python client, HTTP) gets the declared priority, retries and timeout unless it sets them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from harness import Harness

from jobq.cli.main import cli
from jobq.clock import ManualClock
from jobq.errors import UnknownTask
from jobq.models import Priority, RetryPolicy
from jobq.ports import JobQuery


@pytest.fixture
def h(tmp_path: Path, clock: ManualClock) -> Iterator[Harness]:
    harness = Harness("sqlite", tmp_path, clock)

    @harness.app.task(name="billing.invoice", priority="HIGH", retry=RetryPolicy(max_retries=1), timeout_s=60)
    def invoice(customer_id: int, dry_run: bool = False) -> None:
        return None

    harness.worker(worker_id="w-billing").start()  # publishes, as a worker does when it starts
    yield harness
    harness.close()


def jobq(tmp_path: Path, *args: str, **env: str) -> Result:
    store = f"sqlite:///{tmp_path / 'jobq.db'}"
    return CliRunner().invoke(cli, list(args), env={"JOBQ_STORE": store, **env}, catch_exceptions=False)


def test_a_worker_publishes_each_task_it_serves_with_its_declared_options_when_it_starts(h: Harness) -> None:
    info = h.client.declared()["billing.invoice"]
    assert (info.priority, info.queue, info.timeout_s) == (Priority.HIGH, "high", 60.0)
    assert info.retry == RetryPolicy(max_retries=1)
    assert info.parameters == ("customer_id: int", "dry_run: bool = False")
    assert info.worker_id == "w-billing"
    assert info.published_ms == h.clock.now_ms()


def test_jobq_schedule_by_name_gets_the_declared_priority_retries_and_timeout(h: Harness, tmp_path: Path) -> None:
    result = jobq(tmp_path, "schedule", "billing.invoice", "--in", "1h", "--kwargs", '{"customer_id": 7}')
    assert result.exit_code == 0, result.output
    [job] = h.client.list(JobQuery()).items
    assert job.priority is Priority.HIGH
    assert job.retry.max_attempts == 2
    assert job.timeout_s == 60.0


def test_flags_of_jobq_schedule_override_the_declared_options(h: Harness, tmp_path: Path) -> None:
    result = jobq(
        tmp_path, "schedule", "billing.invoice", "--now", "--priority", "low", "--max-retries", "5", "--timeout", "9"
    )
    assert result.exit_code == 0, result.output
    [job] = h.client.list(JobQuery()).items
    assert (job.priority, job.retry.max_retries, job.timeout_s) == (Priority.LOW, 5, 9.0)


def test_a_client_submission_by_name_applies_the_declaration_where_the_spec_is_silent(h: Harness) -> None:
    target = {"type": "TASK", "task": "billing.invoice"}
    silent = h.client.submit({"schedule_type": "IMMEDIATE", "target": target}).job
    assert (silent.priority, silent.retry.max_retries, silent.timeout_s) == (Priority.HIGH, 1, 60.0)
    # A field the request gives wins, even when it gives the default value.
    explicit = h.client.submit(
        {"schedule_type": "IMMEDIATE", "target": target, "priority": "DEFAULT", "retry_policy": {}}
    ).job
    assert (explicit.priority, explicit.retry.max_retries, explicit.timeout_s) == (Priority.DEFAULT, 3, 60.0)


def test_jobq_tasks_lists_the_catalogue(h: Harness, tmp_path: Path) -> None:
    result = jobq(tmp_path, "tasks")
    assert result.exit_code == 0, result.output
    [row] = [line for line in result.output.splitlines() if "billing.invoice" in line]
    assert "HIGH" in row and "high" in row and "60 s" in row and "customer_id: int" in row
    listed = json.loads(jobq(tmp_path, "tasks", "--json").output)
    assert [(t["name"], t["priority"], t["retry_policy"]["max_retries"]) for t in listed] == [
        ("billing.invoice", "HIGH", 1)
    ]


def test_scheduling_a_task_no_worker_has_served_warns_and_stores_the_job(h: Harness, tmp_path: Path) -> None:
    result = jobq(tmp_path, "schedule", "billing.refund", "--in", "5m")
    assert result.exit_code == 0, result.output
    assert "warning: no worker has served task 'billing.refund' yet" in result.output
    assert [j.name for j in h.client.list(JobQuery()).items] == ["billing.refund"]


def test_with_unknown_tasks_refuse_a_task_no_worker_has_served_is_exit_2_and_nothing_is_written(
    h: Harness, tmp_path: Path
) -> None:
    result = jobq(tmp_path, "schedule", "billing.refund", "--in", "5m", JOBQ_UNKNOWN_TASKS="refuse")
    assert result.exit_code == 2
    assert "unknown task 'billing.refund': no worker has registered it (known: billing.invoice)" in result.output
    assert h.client.list(JobQuery()).items == []


def test_the_client_refuses_an_unserved_task_under_the_refuse_setting(tmp_path: Path, clock: ManualClock) -> None:
    harness = Harness("memory", tmp_path, clock, unknown_tasks="refuse")
    try:
        with pytest.raises(UnknownTask, match=r"billing\.refund"):
            harness.client.submit({"schedule_type": "IMMEDIATE", "target": {"type": "TASK", "task": "billing.refund"}})
    finally:
        harness.close()


def test_a_new_declaration_applies_to_the_next_submission_and_a_changed_one_within_a_second(h: Harness) -> None:
    from jobq.models import TaskInfo

    target = {"schedule_type": "IMMEDIATE", "target": {"type": "TASK", "task": "billing.refund"}}
    h.client.submit({"schedule_type": "IMMEDIATE", "target": {"type": "TASK", "task": "billing.invoice"}})  # cached
    h.d.store.publish_tasks([TaskInfo(name="billing.refund", priority=Priority.LOW, published_ms=h.clock.now_ms())])
    assert h.client.submit(target).job.priority is Priority.LOW  # not in the cache: read at once
    h.d.store.publish_tasks(
        [TaskInfo(name="billing.refund", priority=Priority.CRITICAL, published_ms=h.clock.now_ms())]
    )
    h.advance(1.001)
    assert h.client.submit(target).job.priority is Priority.CRITICAL
