"""The simulated deployment: real daemons and a real client over real ports (the memory or the
SQLite backends), on a manual clock, each one an actor that takes turns; a ledger of what every
actor did, and the invariants of design §14 checked as it happens.

The world observes every write a port commits (through `SimPort`), so its model of each run is
exact, and it records every execution of a task (the step pool is the only place tasks run).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobq.app import App
from jobq.clock import ManualClock
from jobq.daemons.base import Daemon
from jobq.daemons.beat import Beat
from jobq.daemons.reaper import Reaper
from jobq.daemons.scanner import Scanner
from jobq.daemons.worker import Worker
from jobq.daemons.worker.attempt import Attempt, AttemptKey, Outcome
from jobq.daemons.worker.execution import execute
from jobq.daemons.worker.pools import Done
from jobq.deployment import Deployment
from jobq.errors import JobqError
from jobq.models import TRANSITIONS, Job, JobStatus, Run, RunState, Transition
from jobq.ports import JobQuery, RunQuery
from jobq.settings import Settings
from jobq.tasks import TaskContext
from jobq.wiring import connect
from simulation.baton import Actor, Crashed, as_actor
from simulation.ports import Faults, SimPort

T0 = 1_790_000_000_000  # a whole minute, UTC

SETTINGS: dict[str, Any] = {
    "history_flush_s": 0,
    "lease_s": 30,
    "heartbeat_s": 10,
    "claim_lease_s": 10,
    "schedule_to_start_s": 30,
    "visibility_timeout_s": 60,
    "horizon_s": 60,
    "misfire_threshold_s": 60,
    "scan_batch": 6,
    "overlap_hold_s": 2,
    "shutdown_grace_s": 0,
    "concurrency": 3,
    # Actors take turns at every port call: a client waiting for another's group commit would
    # hold its turn while the leader waits for one. Each submission is its own transaction here
    # (create_job, faults and all); the group path has tests of its own (test_group_commit.py).
    "group_commit": False,
    "dispatch_lookahead_s": 1,  # runs handed over early and held by workers: cancel, pause and crashes meet them
}
BEATS, SCANNERS, WORKERS, CLIENTS = 2, 2, 3, 2
WORKER_PARTS = ("take", "complete", "monitor")


@dataclass
class Execution:
    """One call of a task function."""

    run_id: str
    job_id: str
    fence: int
    attempt: int
    worker: str
    ok: bool
    step: int
    abandoned: bool  # the worker had given the attempt up (time limit) before it ran


class StepPool:
    """A pool that runs nothing until the simulation says so: executions wait in `pending`."""

    name = "sim"

    def __init__(self, world: World, killable: bool) -> None:
        self.world = world
        self.killable = killable  # like prefork (a hard limit stops the task) or like threads (it cannot)
        self.pending: list[tuple[Attempt, Done]] = []

    def start(self, size: int) -> None:
        pass

    def submit(self, attempt: Attempt, done: Done) -> None:
        self.pending.append((attempt, done))

    def interrupt(self, attempt: Attempt) -> bool:
        return False

    def stop(self, attempt: Attempt) -> bool:
        if not self.killable:
            return False
        self.pending = [(a, d) for a, d in self.pending if a is not attempt]
        return True

    def close(self, wait_s: float) -> None:
        pass

    def run(self, pick: int) -> None:
        attempt, done = self.pending.pop(pick % len(self.pending))
        outcome = execute(attempt.task, attempt.ctx, attempt.payload)
        self.world.executed(attempt, outcome)
        done(attempt.key, outcome)


@dataclass
class WorkerSlot:
    index: int
    incarnation: int = 0
    worker: Worker | None = None
    pool: StepPool | None = None

    @property
    def name(self) -> str:
        return f"w{self.index}"


@dataclass
class World:
    seed: int
    backend: str
    tmp: Path
    clock: ManualClock = field(default_factory=lambda: ManualClock(T0))
    step_no: int = 0
    violations: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)  # only for choices the trace does not carry (pool kinds)
        random.seed(self.seed)  # retry backoffs draw from the module's generator: same draws, same run
        url = "memory://" if self.backend == "memory" else f"sqlite:///{self.tmp / f'sim-{self.seed}.db'}"
        self.raw = connect(Settings.load({"store": url, **SETTINGS}, env={}), self.clock)
        self.faults = Faults(self.on_fault)
        self.d = Deployment(
            self.raw.settings,
            SimPort(self.raw.store, "store", self.faults, self.observe),  # type: ignore[arg-type]
            SimPort(self.raw.index, "index", self.faults, self.observe),  # type: ignore[arg-type]
            SimPort(self.raw.transport, "transport", self.faults, self.observe),  # type: ignore[arg-type]
            self.raw.history,
            self.clock,
        )
        self.app = App(clock=self.clock)
        self.app.use(self.d)
        _register_tasks(self.app)
        self.actors: dict[str, Actor] = {}
        self.daemons: dict[str, Daemon] = {}
        self.workers = [WorkerSlot(i) for i in range(WORKERS)]
        self.stalled_until: dict[str, int] = {}  # group -> clock ms
        self._makers: dict[str, Callable[[], Daemon]] = {}
        for i in range(BEATS):
            self._daemon(f"beat{i}", lambda: Beat(self.d, batch=4))
        for i in range(SCANNERS):
            self._daemon(f"scanner{i}", lambda i=i: Scanner(self.d, scanner_id=f"scanner{i}.{self.step_no}"))
        self._daemon("reaper", lambda: Reaper(self.d, batch=8))
        for slot in self.workers:
            self._new_worker(slot)
        for i in range(CLIENTS):
            self.actors[f"client{i}"] = Actor(f"client{i}")
        # The ledger.
        self.model: dict[str, Run] = {}
        # (run, fence it ran at) -> (actor, state, owner the write named): the one outcome of an attempt
        self.outcomes: dict[AttemptKey, tuple[str, RunState, str | None]] = {}
        self.executions: list[Execution] = []
        self.excused: dict[AttemptKey, set[str]] = {}
        self.cancel_returned: dict[str, int] = {}  # job -> step
        self.pause_returned: dict[str, int] = {}  # job -> step, until a resume begins
        self.resuming: dict[str, int] = {}  # job -> resumes in progress (a pause they overlap proves nothing)
        self.resumes: dict[str, int] = {}  # job -> resumes begun so far
        self.job_ids: list[str] = []
        self.controlled: set[str] = set()  # jobs a cancel, pause or resume was tried on

    # -- actors ---------------------------------------------------------------------------------

    def _daemon(self, name: str, make: Callable[[], Daemon]) -> None:
        self.daemons[name] = make()
        self.actors[name] = Actor(name)
        self._makers[name] = make

    def _new_worker(self, slot: WorkerSlot) -> None:
        slot.incarnation += 1
        slot.pool = StepPool(self, killable=self.rng.random() < 0.5)
        slot.worker = Worker(
            self.d,
            self.app.registry,
            concurrency=SETTINGS["concurrency"],
            worker_id=f"{slot.name}.{slot.incarnation}",
            pool=slot.pool,
            background=False,
        )
        for part in WORKER_PARTS:
            self.actors[f"{slot.name}.{part}"] = Actor(f"{slot.name}.{part}")

    def group_of(self, actor: str) -> str:
        return actor.split(".", 1)[0]

    def stalled(self, group: str) -> bool:
        return self.stalled_until.get(group, 0) > self.clock.now_ms()

    def operation(self, actor: str) -> Callable[[], Any]:
        """What a daemon actor does when it gets a turn while idle: one pass of its loop."""
        if actor in self.daemons:
            daemon = self.daemons[actor]
            return lambda: daemon.run_once(self.clock.now_ms())
        slot = self.workers[int(actor[1 : actor.index(".")])]
        worker = slot.worker
        assert worker is not None
        part = actor.split(".", 1)[1]
        if part == "take":
            return lambda: worker.run_once(self.clock.now_ms())
        if part == "complete":
            return lambda: worker.complete_once(self.clock.now_ms())
        return lambda: worker.monitor_once(self.clock.now_ms())

    def crash(self, group: str) -> None:
        """Kill every actor of `group` (its operations unwind at their next call) and restart it
        with nothing of its memory, as a supervisor would."""
        for name, actor in list(self.actors.items()):
            if self.group_of(name) == group:
                busy = actor.busy
                actor.crash()
                if busy and name.startswith("client"):
                    self.client_done(actor, actor.subject)  # unwound: its error is the crash
                self.actors[name] = Actor(name)
        if group.startswith("w"):
            slot = self.workers[int(group[1:])]
            self._excuse_held(slot, "crash")
            self._new_worker(slot)
        elif group in self.daemons:
            self.daemons[group] = self._makers[group]()

    def stall(self, group: str, ms: int) -> None:
        self.stalled_until[group] = self.clock.now_ms() + ms
        if group.startswith("w"):
            self._excuse_held(self.workers[int(group[1:])], "stall")

    def _excuse_held(self, slot: WorkerSlot, reason: str) -> None:
        assert slot.worker is not None and slot.pool is not None
        keys = [a.key for a in slot.worker.state.snapshot()] + [a.key for a, _ in slot.pool.pending]
        for key in keys:
            self.excused.setdefault(key, set()).add(reason)

    def on_fault(self, actor: str, port: str, method: str) -> None:
        """A renewal that failed may let a lease run out: the attempts it renews are excused."""
        if actor.endswith(".monitor") and port == "store":
            slot = self.workers[int(actor[1 : actor.index(".")])]
            self._excuse_held(slot, f"renewal fault ({method})")

    # -- observing ------------------------------------------------------------------------------

    def observe(self, actor: str, method: str, args: tuple[Any, ...], result: Any) -> None:
        if method == "transition":
            for t, run in zip(args[0], result, strict=True):
                if run is not None:
                    self._commit(actor, run, t)
        elif method in ("claim", "claim_runs"):
            for run in result:
                self._commit(actor, run, None)
        elif method == "create_job":
            if result.created:
                self._created(args[1])
                self.job_ids.append(args[0].job_id)
        elif method == "create_jobs":
            for (job, runs), created in zip(args[0], result, strict=True):
                if created:
                    self._created(runs)
                    self.job_ids.append(job.job_id)
        elif method == "add_runs":
            self._created(result)
        elif method == "advance_jobs":
            for (_, runs), advanced in zip(args[0], result, strict=True):
                if advanced:
                    self._created(runs)

    def _created(self, runs: list[Run]) -> None:
        for run in runs:
            self.model.setdefault(run.run_id, run)

    def _commit(self, actor: str, new: Run, t: Transition | None) -> None:
        old = self.model.get(new.run_id)
        self.model[new.run_id] = new
        if old is None:
            return
        where = f"{actor} moved {new.run_id} {old.state}@{old.fence} -> {new.state}@{new.fence}"
        if new.fence < old.fence:
            self.violate(f"fence went back: {where}")
        if new.state is not old.state and new.state not in TRANSITIONS[old.state]:
            self.violate(f"a transition the table forbids: {where}")
        if old.state is RunState.RUNNING and new.state is not RunState.RUNNING:
            key = (new.run_id, old.fence)
            if key in self.outcomes:
                self.violate(f"a second outcome for one attempt: {where} after {self.outcomes[key]}")
            self.outcomes[key] = (actor, new.state, t.expect_owner if t is not None else None)
        went_on = new.state is not old.state and new.state in (RunState.RUNNING, RunState.SUCCEEDED, RunState.FAILED)
        if went_on and new.job_id in self.cancel_returned:  # from then on, its runs only ever end CANCELLED
            self.violate(f"a run went on after cancel returned (step {self.cancel_returned[new.job_id]}): {where}")
        started = new.state is RunState.RUNNING and old.state is not RunState.RUNNING
        if started and new.started_ms is not None and new.started_ms < new.due_ms:
            self.violate(f"a run started before it was due ({new.due_ms - new.started_ms} ms early): {where}")
        if started and new.job_id in self.pause_returned:
            self.violate(f"a run started after pause returned (step {self.pause_returned[new.job_id]}): {where}")

    def executed(self, attempt: Attempt, outcome: Outcome) -> None:
        run = attempt.run
        execution = Execution(
            run.run_id,
            run.job_id,
            run.fence,
            run.attempt,
            attempt.ctx.worker_id,
            outcome.ok,
            self.step_no,
            attempt.abandoned,
        )
        for earlier in self.executions_of(run.run_id):
            verdict = self.outcomes.get((earlier.run_id, earlier.fence))
            if verdict is not None and verdict[1] is RunState.SUCCEEDED and verdict[2] == earlier.worker:
                self.violate(f"{run.run_id} executed again after its success at fence {earlier.fence}")
            elif not self.explained(earlier):
                self.violate(f"{run.run_id} executed again (fence {run.fence}) and nothing explains {earlier}")
        self.executions.append(execution)

    def executions_of(self, run_id: str) -> list[Execution]:
        return [e for e in self.executions if e.run_id == run_id]

    def explained(self, e: Execution) -> bool:
        """An execution whose outcome its worker did not commit needs a reason: a crash, a stall, a
        failed renewal, a time limit, or a cancel or overlap policy that fenced the run."""
        verdict = self.outcomes.get((e.run_id, e.fence))
        if verdict is not None and verdict[2] == e.worker:
            return True  # its own outcome (or time limit, or hand-back) committed
        if e.abandoned or self.excused.get((e.run_id, e.fence)):
            return True
        return verdict is not None and not verdict[0].startswith(("reaper", "w"))  # a cancel or an overlap policy

    def violate(self, what: str) -> None:
        self.violations.append(f"step {self.step_no}: {what}")

    # -- client operations ----------------------------------------------------------------------

    def client_op(self, op: str, arg: int) -> tuple[Callable[[], Any], str | None]:
        """The client operation `op`, and the job it is about (None for submit and redrive)."""
        client = self.app.client
        if op == "submit":
            return (lambda: _submit(self.app, arg)), None
        if op == "redrive":

            def redrive() -> Any:
                dead = client.dead_letters(limit=50).items
                return client.redrive(dead[arg % len(dead)].run_id) if dead else None

            return redrive, None
        job_id = self.job_ids[arg % len(self.job_ids)] if self.job_ids else None
        if job_id is None:
            return (lambda: None), None
        if op in ("cancel", "pause", "resume"):
            self.controlled.add(job_id)
        if op == "resume":
            self.pause_returned.pop(job_id, None)  # from here on, runs may start again
            self.resuming[job_id] = self.resuming.get(job_id, 0) + 1
            self.resumes[job_id] = self.resumes.get(job_id, 0) + 1
        # A resume in flight when the pause begins may take effect after it (seed 191): the pause
        # then promises nothing, which -1 (never a count) records.
        resumes_before = -1 if op == "pause" and self.resuming.get(job_id) else self.resumes.get(job_id, 0)
        return (lambda: (op, job_id, getattr(client, op)(job_id), resumes_before)), job_id

    def client_done(self, actor: Actor, job_id: str | None = None) -> None:
        """A client operation ended: from a cancel or pause that returned, the guarantee holds."""
        if actor.label.startswith("resume") and job_id is not None:
            self.resuming[job_id] -= 1
            self.pause_returned.pop(job_id, None)
        if actor.error is not None:
            return
        if isinstance(actor.result, tuple) and len(actor.result) == 4:
            op, job_id, _, resumes_before = actor.result
            if op == "cancel":
                self.cancel_returned.setdefault(job_id, self.step_no)
            elif op == "pause" and not self.resuming.get(job_id) and self.resumes.get(job_id, 0) == resumes_before:
                # A resume that began while the pause was under way may have come after it.
                self.pause_returned[job_id] = self.step_no

    def check_error(self, actor: Actor) -> None:
        """Daemons and clients may fail with jobq's own errors (faults, conflicts); anything else is a bug."""
        self.check_failure(actor.name, actor.label, actor.error)

    def check_failure(self, name: str, label: str, error: BaseException | None) -> None:
        if error is None or isinstance(error, Crashed | JobqError):
            return
        self.violate(f"{name} ({label}) raised {type(error).__name__}: {error}")

    def run_now(self, name: str) -> Any:
        """One pass of a daemon actor, to its end, on the scheduler's thread (nothing interleaves)."""
        result, error = as_actor(name, self.operation(name))
        self.check_failure(name, "pass", error)
        return result

    # -- end of a run ---------------------------------------------------------------------------

    def settled(self, until_ms: int) -> bool:
        """A cheap first look, from the observed model: no run held by a lease, and every run due by
        `until_ms` finished (or waiting on a paused job). `open_problems` reads the store itself."""
        open_runs = [r for r in self.model.values() if not r.state.terminal]
        if any(r.state is not RunState.SCHEDULED for r in open_runs):
            return False
        waiting = [r for r in open_runs if r.nominal_ms <= until_ms]
        if not waiting:
            return True
        jobs = self.raw.store.get_jobs(list({r.job_key for r in waiting}))
        return all(j.status is JobStatus.PAUSED for j in (jobs.get(r.job_key) for r in waiting) if j is not None)

    def open_problems(self, until_ms: int) -> list[str]:
        """Runs not settled as they should be by now: an unfinished run of an active job due
        before `until_ms` (or any run held by a lease), and executions nothing explains."""
        problems: list[str] = []
        jobs = {j.key: j for j in _all_jobs(self.raw)}
        for run in _all_runs(self.raw):
            if run.state.terminal:
                continue
            job = jobs.get(run.job_key)
            parked = run.state is RunState.SCHEDULED and job is not None and job.status is JobStatus.PAUSED
            if run.state is not RunState.SCHEDULED or (run.nominal_ms <= until_ms and not parked):
                problems.append(
                    f"{run.run_id} is {run.state}@{run.fence} (due {run.due_ms - T0}, job {job and job.status})"
                )
        for e in self.executions:
            if not self.explained(e):
                problems.append(f"the outcome of {e} was never written and nothing explains it")
        problems += self._missing_fires(jobs, until_ms)
        return problems

    def _missing_fires(self, jobs: dict[str, Job], until_ms: int) -> list[str]:
        """Design §14.5 where the policies make it exact: a cron job with misfire `fire_all` and
        overlap `ALLOW_ALL`, never paused or cancelled, has a run for every fire up to the end,
        whichever daemons were down, crashed or stalled meanwhile."""
        from jobq.schedules import cron_for

        problems = []
        runs = {r.run_id for r in _all_runs(self.raw)}
        for job in jobs.values():
            exact = job.misfire_policy.value == "fire_all" and job.overlap_policy.value == "ALLOW_ALL"
            if not job.recurring or not exact or job.job_id in self.controlled:
                continue
            for fire in cron_for(job.schedule).iter_after(job.created_ms):
                if fire > until_ms:
                    break
                if Run.make_id(job.key, fire) not in runs:
                    problems.append(
                        f"cron job {job.job_id} (fire_all, ALLOW_ALL) has no run for its fire at {fire - T0}"
                    )
        return problems


def _all_runs(d: Deployment) -> list[Run]:
    return d.store.list_runs(RunQuery(limit=100_000)).items


def _all_jobs(d: Deployment) -> list[Job]:
    return d.store.list_jobs(JobQuery(limit=100_000)).items


# -- the tasks --------------------------------------------------------------------------------

CRONS = ("*/5 * * * * *", "*/15 * * * * *", "0 * * * * *", "*/20 * * * * *")
MISFIRES = ("fire_once_now", "skip", "fire_all")
OVERLAPS = ("SKIP", "BUFFER_ONE", "BUFFER_ALL", "CANCEL_OTHER", "ALLOW_ALL")


def _register_tasks(app: App) -> None:
    @app.task(name="sim.ok")
    def ok(n: int = 0) -> int:
        return n

    @app.task(name="sim.flaky", bind=True)
    def flaky(ctx: TaskContext, fail_until: int = 1) -> str:
        if ctx.attempt <= fail_until:
            raise RuntimeError(f"attempt {ctx.attempt} fails")
        return "ok"

    @app.task(name="sim.boom")
    def boom() -> None:
        raise ValueError("always")

    @app.task(name="sim.slow", timeout_s=20)
    def slow() -> str:
        return "slow"


def _submit(app: App, arg: int) -> Any:
    """A submission chosen by `arg` (every parameter is derived from it, so traces replay)."""
    from jobq.models import RetryPolicy

    r = random.Random(arg)
    task = app.registry.get(r.choice(("sim.ok", "sim.ok", "sim.flaky", "sim.boom", "sim.slow")))
    assert task is not None
    from jobq.app import Task

    handle = Task(app, task)
    job_id = f"j{arg}"  # ids decide orders (ties by id): a replay needs the same ones
    retry = RetryPolicy(max_retries=r.choice((0, 1, 2)), initial_interval_sec=0.5, max_interval_sec=3)
    kind = r.random()
    kwargs: dict[str, Any] = {"fail_until": r.choice((0, 1, 3))} if task.name == "sim.flaky" else {}
    if kind < 0.35:
        return handle.schedule(kwargs=kwargs, retry=retry, job_id=job_id)
    if kind < 0.7:
        return handle.schedule(delay_s=r.choice((1, 5, 30, 90, 200)), kwargs=kwargs, retry=retry, job_id=job_id)
    return handle.schedule(
        cron=r.choice(CRONS),
        job_id=job_id,
        kwargs=kwargs,
        retry=retry,
        misfire=r.choice(MISFIRES),
        overlap=r.choice(OVERLAPS),
        jitter_s=r.choice((0, 0, 2)),
    )
