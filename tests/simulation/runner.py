"""Seeded runs of the world: a trace of actions generated from a seed, applied one by one with the
invariants checked after each, then a quiet period in which everything must settle.

A trace is plain data (JSON lists), so a failing run replays exactly from its trace, and a
failing trace is shrunk by dropping actions while it still fails.

    ["step", actor]                         the actor runs until its next port call (an idle one starts a pass)
    ["client", i, op, arg]                  client i starts (or continues) submit/cancel/pause/resume/trigger/redrive
    ["exec", worker, pick]                  the worker's pool runs one pending task
    ["advance", ms]                         the clock moves (live workers' monitors run first, as their threads would)
    ["fault", actor, port, method, mode]    the actor's next such call fails, before or after applying
    ["stall", group, ms]                    the group (a worker, a daemon) gets no turns for a while
    ["crash", group]                        the group is killed mid-call and restarted empty
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulation.world import BEATS, CLIENTS, SCANNERS, WORKER_PARTS, WORKERS, World

Action = list[Any]

DAEMON_ACTORS = (
    [f"beat{i}" for i in range(BEATS)]
    + [f"scanner{i}" for i in range(SCANNERS)]
    + ["reaper"]
    + [f"w{i}.{p}" for i in range(WORKERS) for p in WORKER_PARTS]
)
GROUPS = [f"beat{i}" for i in range(BEATS)] + [f"scanner{i}" for i in range(SCANNERS)] + ["reaper"]
GROUPS += [f"w{i}" for i in range(WORKERS)] + [f"client{i}" for i in range(CLIENTS)]
CLIENT_OPS = (("submit", 40), ("cancel", 12), ("pause", 10), ("resume", 12), ("trigger", 10), ("redrive", 6))
FAULT_POINTS = {
    "store": ("transition", "get_jobs", "get_runs", "claim", "due_jobs", "add_runs", "update_job", "list_runs",
              "create_job", "expired_leases", "overdue_runs", "register_worker", "advance_jobs", "set_job_status"),
    "index": ("add", "claim_due", "claim_runs", "discard", "next_due_ms"),
    "transport": ("publish", "consume", "ack", "nack", "extend"),
}  # fmt: skip


def generate(seed: int, steps: int) -> list[Action]:
    rng = random.Random(seed)
    ops = [op for op, weight in CLIENT_OPS for _ in range(weight)]
    actions: list[Action] = []
    for _ in range(steps):
        x = rng.random()
        if x < 0.40:
            actions.append(["step", rng.choice(DAEMON_ACTORS)])
        elif x < 0.55:
            actions.append(["exec", rng.randrange(WORKERS), rng.randrange(1000)])
        elif x < 0.76:
            actions.append(["client", rng.randrange(CLIENTS), rng.choice(ops), rng.randrange(10**6)])
        elif x < 0.92:
            actions.append(["advance", rng.choice((rng.randint(20, 2000), rng.randint(2000, 5000)))])
        elif x < 0.975:
            port = rng.choice(list(FAULT_POINTS))
            actor = rng.choice([*DAEMON_ACTORS, *(f"client{i}" for i in range(CLIENTS))])
            actions.append(["fault", actor, port, rng.choice(FAULT_POINTS[port]), rng.choice(("before", "after"))])
        elif x < 0.99:
            actions.append(["stall", rng.choice(GROUPS), rng.randint(5_000, 90_000)])
        else:
            actions.append(["crash", rng.choice(GROUPS)])
    return actions


def apply(world: World, action: Action) -> None:
    kind = action[0]
    if kind == "step":
        name = action[1]
        actor = world.actors[name]
        if world.stalled(world.group_of(name)):
            return
        if not actor.busy:
            actor.begin("pass", world.operation(name))
        if actor.step():
            world.check_error(actor)
    elif kind == "client":
        name = f"client{action[1]}"
        actor = world.actors[name]
        if world.stalled(name):
            return
        if not actor.busy:
            op, actor.subject = world.client_op(action[2], action[3])
            actor.begin(f"{action[2]}({action[3]})", op)
        if actor.step():
            world.check_error(actor)
            world.client_done(actor, actor.subject)
    elif kind == "exec":
        slot = world.workers[action[1]]
        if slot.pool is not None and slot.pool.pending and not world.stalled(slot.name):
            slot.pool.run(action[2])
    elif kind == "advance":
        beat_monitors(world)
        world.clock.advance(ms=action[1])
    elif kind == "fault":
        world.faults.arm(action[1], action[2], action[3], action[4])
    elif kind == "stall":
        world.stall(action[1], action[2])
    elif kind == "crash":
        world.crash(action[1])
    else:
        raise ValueError(f"unknown action {action!r}")


def beat_monitors(world: World) -> None:
    """Before time moves on, every live worker's monitor renews what is due, as its thread ticking
    twice a second would: a lease runs out only for a reason the world records."""
    for slot in world.workers:
        if world.stalled(slot.name):
            continue
        actor = world.actors[f"{slot.name}.monitor"]
        if actor.busy:
            actor.finish()
            world.check_error(actor)
        world.run_now(actor.name)


def settle(world: World, *, max_rounds: int = 900) -> None:
    """No more faults, stalls or clients: run every daemon (a second of clock per round) until
    every run due by the end of the trace is finished, or report what never settled."""
    world.faults.armed.clear()
    world.stalled_until.clear()
    for actor in list(world.actors.values()):
        if actor.busy:
            actor.finish()
            world.check_error(actor)
            if actor.name.startswith("client"):
                world.client_done(actor, actor.subject)
    until_ms = world.clock.now_ms()
    for _ in range(max_rounds):
        for name in DAEMON_ACTORS:
            if name.endswith(".monitor"):
                continue
            slot = world.workers[int(name[1])] if name.startswith("w") else None
            for _ in range(50):  # a pass at a time until the actor has nothing left to do
                if slot is not None and slot.pool is not None:
                    while slot.pool.pending:
                        slot.pool.run(0)
                if not world.run_now(name):
                    break
        busy = any(s.worker is not None and s.worker.state.busy() for s in world.workers)
        if not busy and world.settled(until_ms) and not world.open_problems(until_ms):
            return
        beat_monitors(world)
        world.clock.advance(ms=1000 if busy else _idle_jump(world))
    for problem in world.open_problems(until_ms)[:10]:
        world.violate(f"never settled: {problem}")


def _idle_jump(world: World) -> int:
    """No worker holds anything: skip ahead to the next due run (a held run of a paused job waits
    minutes), but by at most a heartbeat, so leases are renewed as a live worker's would be."""
    upcoming = world.raw.index.next_due_ms()
    if upcoming is None:
        return 10_000
    return max(1000, min(10_000, upcoming - world.clock.now_ms()))


@dataclass
class Result:
    seed: int
    backend: str
    trace: list[Action]
    violations: list[str] = field(default_factory=list)
    failed_at: int | None = None  # the action after which the first violation was seen

    @property
    def ok(self) -> bool:
        return not self.violations


def replay(trace: list[Action], *, seed: int = 0, backend: str = "memory", tmp: Path | None = None) -> Result:
    shm = Path("/dev/shm")  # the SQLite files of a run live in memory where the system offers it: no disk waits
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as scratch:
        world = World(seed, backend, tmp or Path(scratch))
        result = Result(seed, backend, trace)
        try:
            for i, action in enumerate(trace):
                world.step_no = i
                apply(world, action)
                if world.violations:
                    result.failed_at = i
                    break
            else:
                world.step_no = len(trace)
                settle(world)
                if world.violations:
                    result.failed_at = len(trace)
        finally:
            for actor in world.actors.values():
                if actor.busy:
                    actor.crash()
            world.raw.close()
        result.violations = list(world.violations)
        return result


def run_seed(seed: int, steps: int, backend: str = "memory") -> Result:
    return replay(generate(seed, steps), seed=seed, backend=backend)


def seed_holds(job: tuple[int, int, str]) -> bool:
    """Whether a seed breaks no guarantee: `run_seed` for a pool of processes, quiet."""
    import logging

    logging.disable(logging.CRITICAL)
    seed, steps, backend = job
    return run_seed(seed, steps, backend).ok


def shrink(result: Result, *, budget_s: float = 60.0) -> Result:
    """A shorter trace that still fails (delta debugging: drop chunks while it keeps failing)."""
    trace = result.trace[: (result.failed_at or len(result.trace)) + 1]
    best = replay(trace, seed=result.seed, backend=result.backend)
    if best.ok:
        return result
    deadline = time.monotonic() + budget_s
    chunk = max(1, len(trace) // 2)
    while chunk >= 1 and time.monotonic() < deadline:
        i = 0
        while i < len(best.trace) and time.monotonic() < deadline:
            candidate = best.trace[:i] + best.trace[i + chunk :]
            attempt = replay(candidate, seed=result.seed, backend=result.backend)
            if not attempt.ok:
                best = attempt
            else:
                i += chunk
        chunk //= 2
    return best


def describe(result: Result) -> str:
    lines = [f"seed {result.seed} ({result.backend}) failed:"]
    lines += [f"  {v}" for v in result.violations[:10]]
    lines.append(f"trace ({len(result.trace)} actions; replay with `python -m simulation --trace FILE`):")
    lines.append(json.dumps(result.trace))
    return "\n".join(lines)
