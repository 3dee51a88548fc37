"""One attempt held by a worker, from its start until its outcome is durable, and the writes that end it.

An attempt is keyed by `(run_id, fence)`: a later attempt of the same run has a larger fence, so
nothing one attempt does (its late outcome, its timeout, its bookkeeping) can touch the next.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from jobq.codec import Envelope
from jobq.models import Job, JobStatus, Run, RunState, Transition
from jobq.ports import Delivery
from jobq.retry import decide
from jobq.tasks import TaskContext, TaskDef

AttemptKey = tuple[str, int]  # (run_id, fence)
MAX_HANDBACKS = 3  # hand-backs a run may have without using an attempt

RUNNING = frozenset({RunState.RUNNING})
STARTABLE = frozenset({RunState.CLAIMED, RunState.DISPATCHED})
ERROR_MAX_CHARS = 2000


class Phase(enum.Enum):
    EXECUTING = "executing"  # the task is running in the pool
    COMPLETING = "completing"  # its outcome is decided and waits to be durable; the lease is still renewed


@dataclass
class Outcome:
    """What one execution of a task produced."""

    result: Any = None
    exc: BaseException | None = None
    error: str | None = None
    retryable: bool | None = None
    retry_after_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(eq=False)
class Attempt:
    """A run this worker started (the store holds it RUNNING under this worker's lease)."""

    run: Run  # as the start left it: RUNNING at this attempt's fence
    job: Job | None
    envelope: Envelope
    delivery: Delivery
    task: TaskDef
    payload: Any  # the task's arguments, from the message or the job
    ctx: TaskContext
    started_ms: int
    timeout_s: float | None  # the hard time limit
    beat_ms: int  # when the lease was last renewed
    soft_timeout_s: float | None = None  # SoftTimeLimitExceeded is raised in the task after this
    interrupted: bool = False  # the soft limit was applied
    phase: Phase = Phase.EXECUTING
    move: Transition | None = None  # the outcome write, once decided
    kind: str = ""  # SUCCEEDED, RETRYING, FAILED, TIMEOUT, HANDED_BACK: what the history records
    error: str | None = None
    duration_ms: int = 0
    tries: int = 0  # outcome writes that raised
    next_try_ms: int = 0
    unknown: bool = False  # a write raised: it may have applied all the same
    abandoned: bool = False  # the execution was given up (time limit, shutdown): its result is ignored

    @property
    def key(self) -> AttemptKey:
        return (self.run.run_id, self.run.fence)

    def decide(self, move: Transition, kind: str, error: str | None, now_ms: int) -> None:
        """Record the outcome write; from here the completer owns the attempt (call it under the
        worker state's lock, which the completer reads under)."""
        self.move = move
        self.kind = kind
        self.error = error
        self.duration_ms = max(0, now_ms - self.started_ms)
        self.next_try_ms = now_ms
        self.phase = Phase.COMPLETING


def completes_job(job: Job | None, run: Run) -> JobStatus | None:
    """COMPLETED when the run's final outcome ends its job: only a one-off's own run does; a
    recurring job goes on, and a triggered run (another fire time) never completes its job."""
    return JobStatus.COMPLETED if job is not None and job.completed_by(run.nominal_ms) else None


def success(run: Run, result: Any, owner: str, now_ms: int, job_status: JobStatus | None) -> Transition:
    return Transition(
        run.run_id,
        RUNNING,
        RunState.SUCCEEDED,
        run.fence,
        {"result": result, "finished_ms": now_ms, "lease_expires_ms": None, "last_error": None},
        expect_owner=owner,
        at_ms=now_ms,
        job_status=job_status,
    )


def failure(
    run: Run,
    job: Job | None,
    outcome: Outcome,
    owner: str,
    now_ms: int,
    *,
    bump_fence: bool = False,
    **more: Any,
) -> tuple[Transition, str]:
    """The write that ends a failed attempt: a retry (SCHEDULED, attempt+1, after the backoff) or
    FAILED on the dead-letter list. `bump_fence` fences off the execution itself (a time limit);
    `more` are further changes to write with it."""
    error = outcome.error or "failed"
    if job is None:
        retry, delay_s, reason = False, 0.0, f"{error} (job no longer exists)"
    else:
        verdict = decide(
            job.retry,
            run.attempt,
            outcome.exc if outcome.exc is not None else error,
            age_s=(now_ms - run.nominal_ms) / 1000,
            retryable=outcome.retryable,
            retry_after_s=outcome.retry_after_s,
            base=run.attempt_base,
        )
        retry, delay_s, reason = verdict.retry, verdict.delay_s, verdict.reason
    cleared = {
        "lease_owner": None,
        "lease_expires_ms": None,
        "last_error": reason[:ERROR_MAX_CHARS],
        "result": outcome.result,
        **more,
    }
    if retry:
        changes = {**cleared, "attempt": run.attempt + 1, "due_ms": now_ms + round(delay_s * 1000), "deadline_ms": None}
        move = Transition(
            run.run_id,
            RUNNING,
            RunState.SCHEDULED,
            run.fence,
            changes,
            bump_fence=bump_fence,
            expect_owner=owner,
            at_ms=now_ms,
        )
        return move, "RETRYING"
    move = Transition(
        run.run_id,
        RUNNING,
        RunState.FAILED,
        run.fence,
        {**cleared, "dead_letter": True, "finished_ms": now_ms},
        bump_fence=bump_fence,
        expect_owner=owner,
        at_ms=now_ms,
        job_status=completes_job(job, run),
    )
    return move, "FAILED"


def renewal(run: Run, owner: str, now_ms: int, lease_ms: int) -> Transition:
    """A heartbeat: the lease of a run this worker holds, extended from `now_ms`."""
    return Transition(
        run.run_id,
        RUNNING,
        RunState.RUNNING,
        run.fence,
        {"lease_expires_ms": now_ms + lease_ms, "last_heartbeat_ms": now_ms},
        expect_owner=owner,
        at_ms=now_ms,
    )


def hand_back(run: Run, job: Job | None, owner: str, now_ms: int, reason: str) -> tuple[Transition, str]:
    """Give a started run back unfinished (fence+1, SCHEDULED now) so another worker runs it, using
    no attempt: a worker shutting down, a start that hung. Each hand-back is counted on the run; past
    `MAX_HANDBACKS`, one counts as a failed attempt (`HandedBack`, retried with backoff or
    dead-lettered), so a deployment that keeps restarting cannot rerun a long task for ever."""
    count = run.handbacks + 1
    if count > MAX_HANDBACKS:
        error = f"HandedBack: {reason} ({count} times)"
        return failure(run, job, Outcome(error=error), owner, now_ms, bump_fence=True, handbacks=count)
    changes = {"due_ms": now_ms, "lease_owner": None, "lease_expires_ms": None, "last_error": f"handed back: {reason}"}
    move = Transition(
        run.run_id,
        RUNNING,
        RunState.SCHEDULED,
        run.fence,
        {**changes, "handbacks": count},
        bump_fence=True,
        expect_owner=owner,
        at_ms=now_ms,
    )
    return move, "HANDED_BACK"


def looks_written(now: Run, move: Transition) -> bool:
    """Whether `now` (the run as the store holds it) is what `move` would have left: used when a
    write raised and may have applied all the same (an unknown outcome), then failed its
    compare-and-set when tried again because it had applied."""
    fence = (move.expect_fence or 0) + (1 if move.bump_fence else 0)
    return now.state is move.to_state and now.fence == fence and now.updated_ms == move.at_ms
