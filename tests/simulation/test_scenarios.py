"""Races found by hand, kept as scenarios: the same world as the seeded runs, with the turns
handed out in a chosen order so the interleaving that broke a guarantee happens every time."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobq.models import JobKey, JobStatus, RunState
from jobq.ports import RunQuery
from simulation.runner import beat_monitors, settle
from simulation.world import World


@pytest.fixture(params=["memory", "sqlite"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    logging.disable(logging.CRITICAL)
    built = World(0, request.param, tmp_path)
    yield built
    for actor in built.actors.values():
        if actor.busy:
            actor.crash()
    built.raw.close()
    logging.disable(logging.NOTSET)


def _pass(world: World, name: str) -> None:
    actor = world.actors[name]
    actor.begin("pass", world.operation(name))
    actor.finish()
    world.check_error(actor)


def _client(world: World, op: str, job_id: str) -> None:
    actor = world.actors["client0"]
    actor.begin(op, lambda: getattr(world.app.client, op)(job_id))


def _runs(world: World, job_id: str) -> list[tuple[RunState, int]]:
    runs = world.raw.store.list_runs(RunQuery(job=JobKey("default", job_id), limit=1000)).items
    return sorted((r.state, r.nominal_ms) for r in runs)


def _task(world: World, name: str = "sim.ok") -> object:
    from jobq.app import Task

    definition = world.app.registry.get(name)
    assert definition is not None
    return Task(world.app, definition)


def test_a_run_a_worker_starts_while_cancel_is_under_way_is_cancelled_before_cancel_returns(world: World) -> None:
    job_id = _task(world).schedule(job_id="c1").job_id  # type: ignore[attr-defined]
    take = world.actors["w0.take"]
    take.begin("take", world.operation("w0.take"))
    take.step_until("store.transition")  # the worker read the job (ACTIVE) and is about to start the run
    _client(world, "cancel", job_id)
    cancel = world.actors["client0"]
    cancel.step_until("store.transition")  # cancel set CANCELLED and read the run as DISPATCHED
    take.finish()  # the run starts: RUNNING
    cancel.finish()
    assert cancel.error is None
    assert _runs(world, job_id)[0][0] is RunState.CANCELLED, "cancel returned only once the running run was fenced"
    world.workers[0].pool.run(0)  # type: ignore[union-attr]  # the task had started before: it runs out
    _pass(world, "w0.complete")
    assert _runs(world, job_id)[0][0] is RunState.CANCELLED, "its success was refused"
    settle(world)
    assert world.violations == []


def test_pause_then_resume_while_a_scanner_holds_the_run_leaves_nothing_parked(world: World) -> None:
    job_id = _task(world).schedule(delay_s=1, job_id="p1").job_id  # type: ignore[attr-defined]
    world.clock.advance(s=2)
    scanner = world.actors["scanner0"]
    scanner.begin("pass", world.operation("scanner0"))
    scanner.step_until("store.get_jobs")  # claimed the run, about to read its job
    _client(world, "pause", job_id)
    world.actors["client0"].finish()
    scanner.step_until("store.transition")  # read the job PAUSED, about to hold the run
    _client(world, "resume", job_id)
    world.actors["client0"].finish()
    scanner.finish()
    assert world.app.client.job(job_id).status is JobStatus.ACTIVE
    settle(world)
    assert world.violations == []
    assert [s for s, _ in _runs(world, job_id)] == [RunState.SUCCEEDED], "not parked for good under an active job"


def test_a_run_dispatched_before_pause_does_not_start_after_pause_returned(world: World) -> None:
    job_id = _task(world).schedule(job_id="p2").job_id  # type: ignore[attr-defined]  # instant: dispatched at once
    _client(world, "pause", job_id)
    world.actors["client0"].finish()
    _pass(world, "w0.take")
    assert world.violations == []
    assert _runs(world, job_id)[0][0] is RunState.SCHEDULED, "held while its job is paused"
    _client(world, "resume", job_id)
    world.actors["client0"].finish()
    settle(world)
    assert world.violations == []
    assert [s for s, _ in _runs(world, job_id)] == [RunState.SUCCEEDED]


def test_fire_once_now_after_a_scanner_outage_runs_the_newest_missed_fire(world: World) -> None:
    job_id = _task(world).schedule(cron="*/10 * * * * *", job_id="f1").job_id  # type: ignore[attr-defined]
    for _ in range(3 * 60 * 6):  # three hours with beat up and both scanners down
        _pass(world, "beat0")
        beat_monitors(world)
        world.clock.advance(s=10)
    now = world.clock.now_ms()
    for _ in range(400):  # the scanner is back: passes of a few runs each until nothing is due
        _pass(world, "scanner0")
    dispatched = [n for s, n in _runs(world, job_id) if s is RunState.DISPATCHED]
    newest_missed = max(n for _, n in _runs(world, job_id) if n <= now - 60_000)
    assert newest_missed in dispatched, "the newest missed fire stands for the misses"
    late = [n for n in dispatched if n <= now - 60_000]
    assert late == [newest_missed], "and it is the only late one that runs"


def test_a_start_whose_outcome_is_unknown_runs_once_at_attempt_1_when_the_store_answers(world: World) -> None:
    """The start batch applied and then raised, and the read asking which writes applied failed
    too: the worker keeps the delivery and asks again on its next take, where it once returned the
    message and left the run RUNNING under its lease, unexecuted, for the reaper (issue 9)."""
    job_id = _task(world).schedule(job_id="u1").job_id  # type: ignore[attr-defined]
    world.faults.arm("w0.take", "store", "transition", "after")
    world.faults.arm("w0.take", "store", "get_runs", "before")
    _pass(world, "w0.take")
    assert _runs(world, job_id)[0][0] is RunState.RUNNING, "the start applied"
    assert world.workers[0].worker.state.busy() == 0, "but the worker does not know it yet"  # type: ignore[union-attr]
    _pass(world, "w0.take")
    assert world.workers[0].worker.state.busy() == 1, "the next take asked again and holds it"  # type: ignore[union-attr]
    settle(world)
    assert world.violations == []
    runs = world.raw.store.list_runs(RunQuery(job=JobKey("default", job_id), limit=10)).items
    assert [(r.state, r.attempt) for r in runs] == [(RunState.SUCCEEDED, 1)]


def test_a_cancel_while_a_worker_holds_a_run_handed_over_early_wins(world: World) -> None:
    job_id = _task(world).schedule(delay_s=0.5, job_id="h1").job_id  # type: ignore[attr-defined]
    _pass(world, "scanner0")  # due within the look-ahead: claimed and handed over before its time
    assert _runs(world, job_id)[0][0] is RunState.DISPATCHED
    _pass(world, "w0.take")
    worker = world.workers[0].worker
    assert worker is not None and len(worker.consumer.waiting) == 1, "held until its due time"
    _client(world, "cancel", job_id)
    world.actors["client0"].finish()
    world.clock.advance(s=1)
    _pass(world, "w0.take")  # its time has come: the start write meets the cancel's fence
    assert _runs(world, job_id)[0][0] is RunState.CANCELLED
    assert world.executions == [] and world.workers[0].pool.pending == []  # type: ignore[union-attr]
    settle(world)
    assert world.violations == []


def test_a_worker_that_crashes_holding_a_run_handed_over_early_leaves_it_to_run_once(world: World) -> None:
    job_id = _task(world).schedule(delay_s=0.5, job_id="h2").job_id  # type: ignore[attr-defined]
    _pass(world, "scanner0")
    _pass(world, "w0.take")
    world.crash("w0")  # the held delivery dies with it; the run stays DISPATCHED under its lease
    world.clock.advance(s=1)  # past its due time, so settling waits for it to finish
    settle(world)
    assert world.violations == []
    [run_id] = {e.run_id for e in world.executions}
    assert len(world.executions_of(run_id)) == 1
    assert [s for s, _ in _runs(world, job_id)] == [RunState.SUCCEEDED]
