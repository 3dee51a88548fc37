"""End to end with real processes: a worker computes what `handle.get()` returns in the test, the
worker and beat sync a module's declared schedules, and a module that schedules a job id when it
is imported is imported again by a second worker without it exiting."""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import JOBQ, Processes, wait_until
from stacks import STACKS, Stack, stack

from jobq import App, RetryPolicy, TaskFailed
from jobq.deployment import Deployment
from jobq.models import JobKey, JobStatus, RunState
from jobq.ports import JobQuery, RunQuery

pytestmark = pytest.mark.slow

TASKS = textwrap.dedent(
    """
    from jobq import App, RetryPolicy

    app = App("e2e")

    @app.task(name="e2e.add")
    def add(x, y):
        return x + y

    @app.task(name="e2e.boom", retry=RetryPolicy(max_retries=0))
    def boom():
        raise ValueError("no invoice 42")

    @app.periodic(cron="* * * * * *", name="tick")
    def tick():
        return "tock"

    @app.task(name="e2e.invoice")
    def invoice(n):
        return n

    # The README's module-level schedule: every process that imports this module runs it again.
    invoice.schedule(cron="0 2 1 * *", tz="America/New_York", args=(42,), job_id="monthly-42")
    """
)


@pytest.fixture(params=STACKS)
def deployed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Stack, Deployment]]:
    (tmp_path / "e2e_results.py").write_text(TASKS)
    with stack(request.param, tmp_path) as built:
        d = built.connect()
        yield built, d
        d.close()


def _client_app(d: Deployment) -> App:
    """The submitting side: the same task names, run by the worker process, never here."""
    app = App("e2e-client")
    app.use(d)
    return app


@pytest.mark.timeout(240)
def test_a_worker_process_computes_what_get_returns_and_syncs_declared_schedules(
    tmp_path: Path, deployed: tuple[Stack, Deployment]
) -> None:
    built, d = deployed
    procs = Processes(tmp_path, built.env)
    try:
        procs.start("worker-1", "worker", "-A", "e2e_results", "-c", "2")
        procs.start("beat", "beat", "-A", "e2e_results")
        procs.start("scanner", "scanner")
        wait_until(lambda: "serving" in procs.log("worker-1"), 60, "the worker to serve")
        app = _client_app(d)

        @app.task(name="e2e.add")
        def add(x: int, y: int) -> int:
            raise AssertionError("runs on the worker")

        @app.task(name="e2e.boom", retry=RetryPolicy(max_retries=0))
        def boom() -> None:
            raise AssertionError("runs on the worker")

        handle = add.delay(2, 3)
        assert handle.get(timeout=60) == 5
        with pytest.raises(TaskFailed) as caught:
            boom.delay().get(timeout=60)
        assert (caught.value.error_type, caught.value.message) == ("ValueError", "no invoice 42")

        run_id = app.client.current_run_id(handle.key)
        assert run_id is not None
        shown = subprocess.run(
            [*JOBQ, "result", run_id],
            check=False,
            env=procs.env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (shown.returncode, shown.stdout.strip()) == (0, "5"), shown.stderr

        tick = JobKey("default", "e2e.tick")

        def ticked() -> bool:
            runs = d.store.list_runs(RunQuery(job=tick, states=frozenset({RunState.SUCCEEDED}))).items
            return any(r.result == "tock" for r in runs)

        wait_until(ticked, 60, "the declared per-second schedule to run")

        # A second worker imports the module again: the module-level schedule and the declared
        # schedule are the jobs that exist, and the worker serves instead of exiting.
        procs.start("worker-2", "worker", "-A", "e2e_results", "-c", "1")
        wait_until(lambda: "serving" in procs.log("worker-2"), 60, "the second worker to serve")
        assert procs.procs["worker-2"].poll() is None, procs.log("worker-2")
        jobs = {str(j.key): j for j in d.store.list_jobs(JobQuery(limit=500)).items}
        assert jobs["e2e.tick"].declared_by == "e2e" and jobs["e2e.tick"].status is JobStatus.ACTIVE
        assert [k for k in jobs if k in ("monthly-42", "e2e.tick")] == ["e2e.tick", "monthly-42"]
    finally:
        codes = procs.stop_all()
    assert all(code == 0 for code in codes.values()), (codes, procs.logs())
