"""The completer: makes every decided outcome durable, then releases its slot and acks its message.

A finished attempt stays held (and its lease renewed by the monitor) until its outcome write
commits or is refused. A write that raises is retried with backoff for as long as it takes;
because it may have applied before raising (an unknown outcome), a retry that then fails its
compare-and-set reads the run back and counts the write as done when the run is exactly what
it would have left. Only a refused write (the fence or the lease moved: the reaper or a cancel
took the run) is dropped, and counted in `jobq_fenced_writes_total`.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Sequence

from jobq.daemons.base import MAX_BACKOFF_S, event
from jobq.daemons.worker.attempt import Attempt, looks_written
from jobq.daemons.worker.broker import BrokerLane
from jobq.daemons.worker.state import WorkerState
from jobq.deployment import Deployment
from jobq.logs import run_fields
from jobq.metrics import METRICS
from jobq.models import Run, RunState
from jobq.ports import IndexEntry

BATCH = 500  # outcomes written in one store call at most


class Completer:
    def __init__(self, deployment: Deployment, state: WorkerState, lane: BrokerLane, *, worker_id: str) -> None:
        self.d = deployment
        self.state = state
        self.lane = lane
        self.worker_id = worker_id
        self.log = logging.getLogger("jobq.worker")
        self.completed = 0  # attempts whose outcome is settled (written or refused)
        self.failing_since_ms: int | None = None  # when outcome writes started failing, if they are
        self._pass = threading.Lock()  # one pass at a time: a pass owns the attempts it took

    def complete(self, now_ms: int) -> int:
        """Write the outcomes that are due, in one store batch; returns how many were settled."""
        with self._pass:
            return self._complete(now_ms)

    def _complete(self, now_ms: int) -> int:
        batch = self.state.completing(now_ms, BATCH)
        if not batch:
            return 0
        moves = [a.move for a in batch if a.move is not None]
        assert len(moves) == len(batch), "a completing attempt always has its outcome write"
        try:
            written = self.d.store.transition(moves)
            confirmed = self._confirm(batch, written)
        except Exception as exc:
            self._postpone(batch, now_ms, exc)
            return 0
        self.failing_since_ms = None
        self._settle(batch, confirmed)
        return len(batch)

    def _confirm(self, batch: Sequence[Attempt], written: Sequence[Run | None]) -> list[Run | None]:
        """Refused writes of attempts whose earlier try raised may have applied then: read those runs."""
        doubtful = [a.run.run_id for a, w in zip(batch, written, strict=True) if w is None and a.unknown]
        if not doubtful:
            return list(written)
        current = self.d.store.get_runs(doubtful)
        out: list[Run | None] = []
        for attempt, run in zip(batch, written, strict=True):
            if run is None and attempt.unknown and attempt.move is not None:
                now = current.get(attempt.run.run_id)
                out.append(now if now is not None and looks_written(now, attempt.move) else None)
            else:
                out.append(run)
        return out

    def _postpone(self, batch: Sequence[Attempt], now_ms: int, exc: Exception) -> None:
        """The store did not answer: keep the attempts (leased, renewed) and try again later."""
        if self.failing_since_ms is None:
            self.failing_since_ms = now_ms
        METRICS.loop_errors.inc(daemon="completer")
        tries = 0
        for attempt in batch:
            attempt.tries += 1
            attempt.unknown = True
            ceiling_s = min(MAX_BACKOFF_S, 0.05 * 2**attempt.tries)
            attempt.next_try_ms = now_ms + round(random.uniform(ceiling_s / 2, ceiling_s) * 1000)
            tries = max(tries, attempt.tries)
        self.log.warning("could not record %d outcomes (try %d), retrying: %s", len(batch), tries, exc)

    def _settle(self, batch: Sequence[Attempt], written: Sequence[Run | None]) -> None:
        """Outcomes are durable (or refused): index retries, record history, ack, free the slots."""
        reindex: list[IndexEntry] = []
        events = []
        for attempt, after in zip(batch, written, strict=True):
            if after is None:
                METRICS.fenced_writes.inc(op="complete")
                self.log.warning(
                    "outcome refused: the run moved on (fence or lease lost)", extra=run_fields(attempt.run)
                )
                continue
            METRICS.completed.inc(outcome=attempt.kind)
            if after.state is RunState.SCHEDULED:
                reindex.append(IndexEntry(after.run_id, after.due_ms, after.priority))
            # The outcome of the attempt that ran, under its own number and fence (a retry's write
            # already holds the next attempt's number).
            ran = {"attempt": attempt.run.attempt, "fence": attempt.run.fence}
            events.append(
                event(
                    after, attempt.kind, after.updated_ms, worker=self.worker_id, duration_ms=attempt.duration_ms, **ran
                )
            )
            self._log(attempt, after)
        self.completed += len(batch)
        try:
            if reindex:
                self.d.index.add(reindex)  # should this fail, beat's repair re-indexes them
            if events:
                self.d.history.record(events)
        except Exception:
            METRICS.loop_errors.inc(daemon="completer")
            self.log.exception("outcomes written, but indexing %d of them failed", len(batch))
        finally:
            self.state.release(batch)
            self.lane.ack([a.delivery for a in batch])  # in the broker lane: a stalled broker holds up no write

    def _log(self, attempt: Attempt, after: Run) -> None:
        fields = run_fields(attempt.run, task=attempt.envelope.task, duration_ms=attempt.duration_ms)
        if attempt.kind == "SUCCEEDED":
            if self.log.isEnabledFor(logging.INFO):
                self.log.info("succeeded", extra=fields)
        elif attempt.kind == "HANDED_BACK":
            self.log.warning("handed back unfinished", extra=fields)
        else:
            then = f"retry at attempt {after.attempt}" if after.state is RunState.SCHEDULED else "dead-lettered"
            self.log.warning("failed: %s; %s", attempt.error, then, extra=fields)
