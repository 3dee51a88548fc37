"""One record that does not decode never stops a pass (design §14.6), on every store backend.

Each test writes a poison row straight into the store (raw SQL, a raw DynamoDB item) beside a
healthy cron job and drives beat, scanner and reaper passes on a manual clock: the passes go on,
the healthy job keeps producing and dispatching runs, the poison record is quarantined once
(counted, logged once, its runs dead-lettered as Corrupt), and list, status and cancel still work.
"""

from __future__ import annotations

import logging

import pytest
from factories import T0, key, make_job, make_run

from jobq.client import Client
from jobq.daemons.beat import Beat
from jobq.daemons.reaper import Reaper
from jobq.daemons.scanner import Scanner
from jobq.deployment import Deployment
from jobq.errors import Conflict
from jobq.metrics import METRICS
from jobq.models import JobStatus, Run, RunState, Schedule, ScheduleType, TaskTarget
from jobq.ports import IndexEntry, JobQuery, RunQuery
from jobq.submission import JobSpec
from jobq.views import job_resource, job_summary

from .deployed import deployed  # noqa: F401 - a deployment over the store under test
from .poison import write_poison_job, write_poison_run
from .test_store import store  # noqa: F401 - the parametrised fixture over every backend

S = RunState
EVERY_SECOND = "*/1 * * * * *"


def _healthy_cron(d: Deployment) -> None:
    # ALLOW_ALL: no worker runs here, and every due fire should be dispatched, not skipped for overlap.
    spec = {
        "job_id": "healthy",
        "schedule_type": "CRON",
        "cron_expression": EVERY_SECOND,
        "overlap_policy": "ALLOW_ALL",
    }
    Client(d).submit(JobSpec.model_validate({**spec, "target": TaskTarget(task="tests.noop")}))


def _poison_cron(d: Deployment, *, next_fire_ms: int = T0 + 1000) -> None:
    cron = Schedule(type=ScheduleType.CRON, cron=EVERY_SECOND)
    write_poison_job(d.store, make_job("poison", name="poisoned", schedule=cron, next_fire_ms=next_fire_ms))


def _runs(d: Deployment, job_id: str) -> list[Run]:
    return d.store.list_runs(RunQuery(job=key(job_id), limit=1000)).items


def _corrupt(kind: str) -> float:
    return METRICS.corrupt_records.value(kind=kind)


def _pass(d: Deployment, *daemons: Beat | Scanner | Reaper, s: float = 1.0) -> None:
    d.clock.advance(s=s)  # type: ignore[attr-defined]
    for daemon in daemons:
        daemon.run_once(d.clock.now_ms())


def test_beat_quarantines_a_job_that_does_not_decode_once_and_the_healthy_cron_keeps_running(
    deployed: Deployment,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    _healthy_cron(deployed)
    _poison_cron(deployed)
    deployed.store.add_runs([make_run("poison", T0 + 500)])  # an open run the poison job had already
    beat, scanner = Beat(deployed), Scanner(deployed, scanner_id="scanner-test")
    before = _corrupt("job")
    caplog.set_level(logging.INFO, logger="jobq")
    for _ in range(4):
        _pass(deployed, beat, scanner)
    poison = Client(deployed).job("poison")
    assert poison.status is JobStatus.QUARANTINED
    assert poison.status_reason is not None and "retry.max_retries" in poison.status_reason
    [run] = _runs(deployed, "poison")
    assert (run.state, run.dead_letter) == (S.FAILED, True)
    assert run.last_error is not None and run.last_error.startswith("Corrupt: ")
    assert _corrupt("job") - before == 1
    assert sum(r.getMessage().startswith("quarantined job poison:") for r in caplog.records) == 1
    healthy = _runs(deployed, "healthy")
    assert len(healthy) >= 5, "the healthy cron job kept creating runs"
    assert sum(r.state is S.DISPATCHED for r in healthy) >= 4, "and its due runs were dispatched"


def test_the_scanner_dead_letters_a_claimed_run_that_does_not_decode_and_dispatches_the_rest(
    deployed: Deployment,  # noqa: F811
) -> None:
    _healthy_cron(deployed)
    field = write_poison_run(deployed.store, make_run("healthy", T0 + 500))
    deployed.index.add([IndexEntry(f"healthy:{T0 + 500}", T0 + 500, make_run().priority)])
    beat, scanner = Beat(deployed), Scanner(deployed, scanner_id="scanner-test")
    before = _corrupt("run")
    for _ in range(3):
        _pass(deployed, beat, scanner)
    poison = deployed.store.get_runs([f"healthy:{T0 + 500}"])[f"healthy:{T0 + 500}"]
    assert poison.corrupt is not None and poison.corrupt.startswith(f"{field}:")
    assert (poison.state, poison.dead_letter) == (S.FAILED, True)
    assert poison.last_error is not None and poison.last_error.startswith("Corrupt: its record does not decode")
    assert _corrupt("run") - before == 1
    dispatched = [r for r in _runs(deployed, "healthy") if r.state is S.DISPATCHED]
    assert len(dispatched) == 3
    assert Client(deployed).job("healthy").status is JobStatus.ACTIVE


def test_the_scanner_quarantines_the_job_of_a_claimed_run_when_the_job_does_not_decode(
    deployed: Deployment,  # noqa: F811
) -> None:
    _healthy_cron(deployed)
    _poison_cron(deployed, next_fire_ms=T0 + 3_600_000)  # not due for beat: the scanner meets it first
    deployed.store.add_runs([make_run("poison", T0 + 500), make_run("poison", T0 + 90_000)])
    deployed.index.add([IndexEntry(f"poison:{T0 + 500}", T0 + 500, make_run().priority)])
    beat, scanner = Beat(deployed), Scanner(deployed, scanner_id="scanner-test")
    before = _corrupt("job")
    for _ in range(2):
        _pass(deployed, beat, scanner)
    assert Client(deployed).job("poison").status is JobStatus.QUARANTINED
    assert {(r.state, r.dead_letter) for r in _runs(deployed, "poison")} == {(S.FAILED, True)}
    assert _corrupt("job") - before == 1
    assert sum(r.state is S.DISPATCHED for r in _runs(deployed, "healthy")) == 2


def test_the_reaper_dead_letters_what_does_not_decode_and_reclaims_the_rest(deployed: Deployment) -> None:  # noqa: F811
    jobs = deployed.store
    _healthy_cron(deployed)
    lease = {"state": S.RUNNING, "fence": 2, "lease_owner": "gone", "lease_expires_ms": T0 + 100}
    jobs.add_runs([make_run("healthy", T0 + 10, **lease)])
    write_poison_run(jobs, make_run("healthy", T0 + 20, **lease))  # a run that does not decode
    _poison_cron(deployed, next_fire_ms=T0 + 3_600_000)
    jobs.add_runs([make_run("poison", T0 + 30, **lease)])  # a sound run of a job that does not decode
    reaper = Reaper(deployed)
    runs_before, jobs_before = _corrupt("run"), _corrupt("job")
    _pass(deployed, reaper)
    _pass(deployed, reaper)
    found = jobs.get_runs([f"healthy:{T0 + 10}", f"healthy:{T0 + 20}", f"poison:{T0 + 30}"])
    assert (found[f"healthy:{T0 + 10}"].state, found[f"healthy:{T0 + 10}"].attempt) == (S.SCHEDULED, 2)
    for run_id in (f"healthy:{T0 + 20}", f"poison:{T0 + 30}"):
        assert (found[run_id].state, found[run_id].dead_letter) == (S.FAILED, True)
        assert (found[run_id].last_error or "").startswith("Corrupt: ")
    assert (_corrupt("run") - runs_before, _corrupt("job") - jobs_before) == (1, 1)
    assert Client(deployed).job("poison").status is JobStatus.QUARANTINED


def test_list_status_and_cancel_work_on_a_job_that_does_not_decode(deployed: Deployment) -> None:  # noqa: F811
    _healthy_cron(deployed)
    _poison_cron(deployed)
    deployed.store.add_runs([make_run("poison", T0 + 1000), make_run("poison", T0 + 2000)])
    client = Client(deployed)
    listed = {j.job_id: j for j in client.list(JobQuery()).items}
    assert set(listed) == {"healthy", "poison"} and listed["healthy"].corrupt is None
    assert job_summary(listed["poison"])["corrupt"].startswith("retry.max_retries:")
    view = client.get("poison")
    resource = job_resource(view)
    assert (resource["job_name"], resource["job_status"], resource["run_counts"]) == (
        "poisoned",
        "ACTIVE",
        {"SCHEDULED": 2},
    )
    assert resource["cron_expression"] == EVERY_SECOND and resource["next_fire_times"] == []
    with pytest.raises(Conflict, match="does not decode"):
        client.pause("poison")
    with pytest.raises(Conflict, match="does not decode"):
        client.trigger("poison")
    assert client.cancel("poison").status is JobStatus.CANCELLED
    assert {r.state for r in _runs(deployed, "poison")} == {S.CANCELLED}
    after = client.get("poison").job
    assert (after.status, after.corrupt is not None) == (JobStatus.CANCELLED, True)
    beat = Beat(deployed)
    _pass(deployed, beat)
    assert client.job("poison").status is JobStatus.CANCELLED  # a cancelled job is not quarantined
    assert client.job("healthy").status is JobStatus.ACTIVE


def test_a_quarantined_job_resumes_once_its_record_decodes(deployed: Deployment) -> None:  # noqa: F811
    _poison_cron(deployed)
    _pass(deployed, Beat(deployed))
    client = Client(deployed)
    assert client.job("poison").status is JobStatus.QUARANTINED
    with pytest.raises(Conflict, match="does not decode"):
        client.resume("poison")
    # An operator repairs the row in place: a sound record under the same key, still QUARANTINED.
    repaired = make_job("poison", schedule=Schedule(type=ScheduleType.CRON, cron=EVERY_SECOND))
    _overwrite(deployed, repaired.model_copy(update={"status": JobStatus.QUARANTINED, "version": 1}))
    resumed = client.resume("poison")
    assert (resumed.status, resumed.status_reason) == (JobStatus.ACTIVE, None)
    _pass(deployed, Beat(deployed))
    assert any(r.state is S.SCHEDULED for r in _runs(deployed, "poison"))


def _overwrite(d: Deployment, job: object) -> None:
    """Replace a stored job record whatever it holds (an operator's repair of a corrupt row)."""
    from jobq.models import Job

    assert isinstance(job, Job)
    target = d.store
    current = target.get_jobs([job.key])[job.key]
    if current.corrupt is None:
        target.update_job(job.model_copy(update={"version": current.version}))
        return
    write_over = getattr(target, "put_raw_job", None)
    if write_over is not None:  # memory
        write_over(job.model_dump(mode="json"))
        return
    from jobq.store.sqlite import SqliteStore

    if isinstance(target, SqliteStore):
        with target.db.write() as conn:
            conn.execute(
                "UPDATE jobq_jobs SET doc = ?, status = ? WHERE tenant_id = ? AND job_id = ?",
                (job.model_dump_json(), job.status.value, job.tenant_id, job.job_id),
            )
        return
    if hasattr(target, "db"):  # PostgreSQL
        sql = target.db.sql("UPDATE {jobs} SET doc = %s::jsonb, status = %s WHERE tenant_id = %s AND job_id = %s")
        params = [job.model_dump_json(), job.status.value, job.tenant_id, job.job_id]
        target.db.run(lambda conn: conn.execute(sql, params))
        return
    from jobq.store.dynamodb_items import job_item

    item = job_item(job)
    target.table.call("put_item", TableName=target.table.name, Item=item)  # type: ignore[attr-defined]
