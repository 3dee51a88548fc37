"""A run of a task no worker serves is handed on through the store, whatever the broker: RabbitMQ
keeps no delivery count worth trusting (it reports a message redelivered, at most), so counting
on the broker requeued such a message for ever."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Harness
from services import require_rabbitmq
from stacks import self_hosted_cleanups

from jobq.clock import ManualClock
from jobq.models import RunState
from jobq.submission import JobSpec


@pytest.fixture
def h(tmp_path: Path, clock: ManualClock) -> Iterator[Harness]:
    amqp = require_rabbitmq()
    tag = f"t{uuid.uuid4().hex[:10]}"
    harness = Harness("sqlite", tmp_path, clock, broker=f"{amqp}?prefix={tag}")
    yield harness
    harness.close()
    delete_queues = self_hosted_cleanups(tag)[2]
    delete_queues()


def test_on_rabbitmq_a_run_no_worker_serves_fails_as_unknown_task_after_five_hand_ons(h: Harness) -> None:
    spec = JobSpec.parse({"schedule_type": "IMMEDIATE", "target": {"type": "TASK", "task": "t.nobody"}})
    job = h.client.submit(spec).job
    worker = h.worker()
    for _ in range(20):
        h.dispatch()
        worker.run_once(h.clock.now_ms(), wait_s=2)
        assert worker.wait_idle(5)
        run = h.client.get(job.job_id).current_run
        if run is not None and run.state.terminal:
            break
        h.advance(1.1)
    assert run is not None and run.state is RunState.FAILED and run.dead_letter
    assert run.last_error is not None and "UnknownTask" in run.last_error
    assert run.handbacks == 4, "handed on four times, failed on the fifth"
