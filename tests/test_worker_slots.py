"""A slot is one execution: it is free for the next task as soon as the task returns, while the
finished attempt stays held, leased and fenced until its outcome write commits; and completing
attempts beyond the pool size take slots again, so a store that does not answer bounds what the
worker takes (issue 13, prefork using both cores)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from faults import FaultPlan, Faulty
from harness import Harness

from jobq.app import Task
from jobq.clock import ManualClock
from jobq.daemons.worker import Worker
from jobq.models import Run, RunState, Transition


@pytest.fixture(params=["memory", "sqlite"])
def h(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> Iterator[Harness]:
    harness = Harness(request.param, tmp_path, clock)
    yield harness
    harness.close()


def _outcomes(ts: Sequence[Transition]) -> bool:
    return any(t.to_state in (RunState.SUCCEEDED, RunState.FAILED) for t in ts)


class _HeldOutcomes:
    """The real store, but a transition batch carrying outcomes waits for `release` before it
    reaches the store: an outcome write held open mid-commit. Every other call passes through."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.entered = threading.Event()
        self.release = threading.Event()

    def transition(self, moves: Sequence[Transition]) -> list[Run | None]:
        if _outcomes(moves):
            self.entered.set()
            assert self.release.wait(30), "the test never released the held outcome write"
        result: list[Run | None] = self._inner.transition(moves)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _names(h: Harness) -> list[str]:
    """Register `t.note`, which returns its argument; the names it ran, in order."""
    ran: list[str] = []

    @h.app.task(name="t.note")
    def note(name: str) -> str:
        ran.append(name)
        return name

    return ran


def test_the_next_task_runs_on_the_freed_slot_while_the_first_outcome_is_still_being_written(h: Harness) -> None:
    ran = _names(h)
    store = _HeldOutcomes(h.d.store)
    h.d.store = store  # type: ignore[assignment]
    worker = h.worker(background=False, concurrency=1)
    try:
        _first_outcome_held(h, worker, store, ran)
    finally:
        store.release.set()


def _first_outcome_held(h: Harness, worker: Worker, store: _HeldOutcomes, ran: list[str]) -> None:
    jobs = [_delay(h, "first"), _delay(h, "second")]
    assert worker.run_once(h.clock.now_ms()) == 1, "one slot: one delivery"
    assert worker.state.wait(lambda: worker.state.executing() == 0, 5)
    writer = threading.Thread(target=worker.complete_once, args=(h.clock.now_ms(),), daemon=True)
    writer.start()
    assert store.entered.wait(5), "the first outcome write is under way"

    assert worker.state.free() == 1, "the task returned: its slot is free though its outcome is not durable"
    assert worker.run_once(h.clock.now_ms()) == 1, "the second delivery is taken on the freed slot"
    assert worker.state.wait(lambda: worker.state.executing() == 0, 5)
    assert ran == ["first", "second"]
    assert worker.state.busy() == 2, "both attempts are held until their outcomes commit"
    held = h.d.store.get_runs([r.run_id for r in _runs(h, jobs)])
    assert all(r.state is RunState.RUNNING and r.lease_owner == worker.worker_id for r in held.values())

    for _ in range(3):  # 60 s, twice the 30 s lease: the completing attempts' leases are renewed
        h.advance(20)
        worker.monitor_once(h.clock.now_ms())
        assert h.reaper.run_once(h.clock.now_ms()) == 0, "a completing attempt keeps its lease"

    store.release.set()
    writer.join(5)
    worker.complete_once(h.clock.now_ms())
    assert worker.state.busy() == 0
    runs = _runs(h, jobs)
    assert [(r.state, r.attempt, r.result) for r in runs] == [
        (RunState.SUCCEEDED, 1, "first"),
        (RunState.SUCCEEDED, 1, "second"),
    ]


def test_a_worker_whose_outcomes_cannot_be_written_stops_taking_work_at_twice_its_slots(h: Harness) -> None:
    _names(h)
    plan = FaultPlan()
    h.d.store = Faulty(h.d.store, "store", plan)  # type: ignore[assignment]
    worker = h.worker(background=False, concurrency=2)
    jobs = [_delay(h, f"n{i}") for i in range(10)]
    plan.script("store", "transition", "before", times=10**6, when=_outcomes)  # the store refuses outcomes
    taken = 0
    for _ in range(10):
        n = worker.run_once(h.clock.now_ms())
        taken += n
        assert worker.state.wait(lambda: worker.state.executing() == 0, 5)
        worker.complete_once(h.clock.now_ms())  # fails: the outcomes stay held
        h.advance(1)
    assert taken == 4, "two completing attempts per slot at most: the bound is the pool size"
    assert worker.state.busy() == 4 and worker.state.completing_count() == 4
    assert worker.state.free() == 0 and worker.state.occupied() == 2
    assert worker.run_once(h.clock.now_ms()) == 0, "nothing more is taken while the outcomes are stuck"

    plan.scripted.clear()  # the store is back
    h.advance(60)
    for _ in range(20):
        worker.complete_once(h.clock.now_ms())
        worker.run_once(h.clock.now_ms())
        worker.state.wait(lambda: worker.state.executing() == 0, 5)
        if all(r.state is RunState.SUCCEEDED for r in _runs(h, jobs)):
            break
        h.advance(60)
    assert [(r.state, r.attempt) for r in _runs(h, jobs)] == [(RunState.SUCCEEDED, 1)] * 10


def test_completing_attempts_within_the_bound_count_as_neither_busy_nor_free_slots_taken(h: Harness) -> None:
    _names(h)
    plan = FaultPlan()
    h.d.store = Faulty(h.d.store, "store", plan)  # type: ignore[assignment]
    worker: Worker = h.worker(background=False, concurrency=2)
    _delay(h, "a")
    plan.script("store", "transition", "before", times=10**6, when=_outcomes)
    assert worker.run_once(h.clock.now_ms()) == 1
    assert worker.state.wait(lambda: worker.state.executing() == 0, 5)
    report = worker.report()
    assert (report["busy"], report["free"], report["lost"]) == (0, 2, 0)
    assert worker.state.completing_count() == 1


def _delay(h: Harness, name: str) -> str:
    note = h.app.registry.get("t.note")
    assert note is not None
    job_id: str = Task(h.app, note).delay(name).job_id
    h.dispatch()
    return job_id


def _runs(h: Harness, jobs: list[str]) -> list[Run]:
    runs = [h.client.get(j).current_run for j in jobs]
    assert all(r is not None for r in runs)
    return [r for r in runs if r is not None]
