"""Control operations (cancel, pause, resume, trigger) against daemons moving the same runs
(issue "Trust under faults", items 7 to 10)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Harness

from jobq.clock import ManualClock
from jobq.models import JobKey, JobStatus, RetryPolicy, RunState
from jobq.ports import RunQuery


@pytest.fixture(params=["memory", "sqlite"])
def h(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> Iterator[Harness]:
    harness = Harness(request.param, tmp_path, clock)
    yield harness
    harness.close()


def _runs(h: Harness, job_id: str) -> list[tuple[RunState, int]]:
    runs = h.d.store.list_runs(RunQuery(job=JobKey("default", job_id), limit=1000)).items
    return [(r.state, r.nominal_ms) for r in sorted(runs, key=lambda r: r.nominal_ms)]


@pytest.mark.parametrize("fails", [False, True])
def test_a_triggered_run_of_a_one_off_leaves_its_scheduled_fire_to_happen(h: Harness, fails: bool) -> None:
    @h.app.task(name="t.maybe")
    def maybe() -> None:
        if fails:
            raise ValueError("no")

    handle = maybe.schedule(delay_s=600, retry=RetryPolicy(max_retries=0))
    triggered = h.client.trigger(handle.job_id)
    h.cycle()
    assert h.client.run(triggered.run_id).state is (RunState.FAILED if fails else RunState.SUCCEEDED)
    assert h.client.job(handle.job_id).status is JobStatus.ACTIVE, "the job's own fire is still to come"
    h.advance(600)
    h.cycle()
    states = [s for s, _ in _runs(h, handle.job_id)]
    assert states == [RunState.FAILED if fails else RunState.SUCCEEDED] * 2
    assert h.client.job(handle.job_id).status is JobStatus.COMPLETED
