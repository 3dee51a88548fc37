"""What one worker holds: its attempts, from the start write until their outcome is durable.

The consumer adds attempts, the pool reports their outcomes, the lease monitor renews them and
applies time limits, the completer writes their outcomes and releases them.

A slot is one execution in the pool. It is taken by an attempt while its task runs, and by an
execution the worker gave up on but could not stop (a thread past its hard time limit: a *lost*
slot, until the function returns). Once the task has returned, its attempt stays held (leased,
renewed, fenced) until its outcome write commits, but its slot is free for the next task: the
pool does not idle while an outcome travels to the store. That holds for up to `concurrency`
completing attempts; past that bound each further one takes a slot again, so a store that does
not answer makes the worker stop taking work with at most twice `concurrency` attempts held.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from jobq.daemons.worker.attempt import Attempt, AttemptKey, Phase


class WorkerState:
    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.lock = threading.RLock()  # re-entrant: `wait` predicates may call the readers below
        self.changed = threading.Condition(self.lock)  # notified whenever attempts or slots change
        self.held: dict[AttemptKey, Attempt] = {}
        self._completing = 0  # held attempts in Phase.COMPLETING (lost ones included)
        self.lost: set[AttemptKey] = set()  # executions given up on that still occupy a slot
        self.late_ms = 0  # the largest start lateness since the autoscaler last looked
        self.reserved = 0  # slots kept for deliveries held until their not-before time (look-ahead)

    def resize(self, concurrency: int) -> None:
        """Change the number of slots (autoscaling); a smaller number frees no running attempt."""
        with self.changed:
            self.concurrency = concurrency
            self.changed.notify_all()

    def note_lateness(self, late_ms: int) -> None:
        with self.lock:
            self.late_ms = max(self.late_ms, late_ms)

    def take_lateness(self) -> int:
        with self.lock:
            late, self.late_ms = self.late_ms, 0
            return late

    def free(self) -> int:
        """Slots the consumer may fill now: the size, less the slots taken and those reserved for
        held deliveries."""
        with self.lock:
            return max(0, self.concurrency - self._taken() - len(self.lost) - self.reserved)

    def occupied(self) -> int:
        """Slots not free and not reserved: executions running (lost ones included), and completing
        attempts past the bound."""
        with self.lock:
            return self._taken() + len(self.lost)

    def taken(self) -> int:
        """Slots busy with an attempt: executing, or completing beyond the bound (lost slots apart)."""
        with self.lock:
            return self._taken()

    def _taken(self) -> int:
        """Slots held by attempts (a lost execution's slot is counted in `lost`, not here): those
        executing, and the completing ones beyond `concurrency` (call under the lock)."""
        executing = len(self.held) - self._completing
        lost_completing = sum(1 for key in self.lost if key in self.held)  # given up: counted as lost
        return executing + max(0, self._completing - lost_completing - self.concurrency)

    def reserve(self, n: int) -> None:
        """Keep `n` slots for deliveries held until their not-before time (released with `unreserve`
        when they start or go back), so a held run finds its slot free at its due time."""
        with self.changed:
            self.reserved += n
            self.changed.notify_all()

    def unreserve(self, n: int) -> None:
        with self.changed:
            self.reserved = max(0, self.reserved - n)
            self.changed.notify_all()

    def lost_slots(self) -> int:
        with self.lock:
            return len(self.lost)

    def busy(self) -> int:
        """Attempts held: executing, or completing (their outcome not yet durable)."""
        with self.lock:
            return len(self.held)

    def executing(self) -> int:
        with self.lock:
            return len(self.held) - self._completing

    def completing_count(self) -> int:
        """Held attempts whose outcome is decided and not yet durable."""
        with self.lock:
            return self._completing

    def add(self, attempts: Iterable[Attempt]) -> None:
        # The one change that notifies nobody: an add only takes slots and starts executions, which
        # no waiter waits for (free slots, a due outcome write, nothing held, nothing executing);
        # waking them per start batch cost a lock hand-off each (issue 14).
        with self.lock:
            for attempt in attempts:
                self._drop(attempt.key)
                self.held[attempt.key] = attempt
                if attempt.phase is Phase.COMPLETING:
                    self._completing += 1

    def snapshot(self) -> list[Attempt]:
        with self.lock:
            return list(self.held.values())

    def finish(self, key: AttemptKey, decide: Callable[[Attempt], None]) -> bool:
        """Hand an executing attempt's outcome over: `decide(attempt)` records the outcome write.
        False when the attempt is no longer executing here (given up on, handed back, or from an
        earlier fence): its late outcome is ignored, and a lost slot it held comes back."""
        with self.changed:
            attempt = self.held.get(key)
            if attempt is None or attempt.phase is not Phase.EXECUTING:
                if key in self.lost:
                    self.lost.discard(key)
                    self.changed.notify_all()
                return False
            decide(attempt)
            self._count_decided(attempt)
            self.changed.notify_all()
            return True

    def give_up(self, attempt: Attempt, decide: Callable[[Attempt], None]) -> bool:
        """Stop waiting for an executing attempt (time limit, shutdown): `decide` records the write
        that ends it. Its execution's slot counts as lost until the function returns (`finish`)
        or the pool stops it (`recover`). False when the attempt had already finished."""
        with self.changed:
            if self.held.get(attempt.key) is not attempt or attempt.phase is not Phase.EXECUTING:
                return False
            attempt.abandoned = True
            decide(attempt)
            self._count_decided(attempt)
            self.lost.add(attempt.key)
            self.changed.notify_all()
            return True

    def recover(self, key: AttemptKey) -> None:
        """The pool stopped a given-up execution: its slot is free again."""
        with self.changed:
            self.lost.discard(key)
            self.changed.notify_all()

    def completing(self, now_ms: int, limit: int) -> list[Attempt]:
        """Attempts whose outcome is due to be written (first try, or a retry whose backoff ended)."""
        with self.lock:
            due = [a for a in self.held.values() if a.phase is Phase.COMPLETING and a.next_try_ms <= now_ms]
        due.sort(key=lambda a: a.next_try_ms)
        return due[:limit]

    def next_write_ms(self) -> int | None:
        with self.lock:
            times = [a.next_try_ms for a in self.held.values() if a.phase is Phase.COMPLETING]
        return min(times) if times else None

    def release(self, attempts: Iterable[Attempt]) -> None:
        """The attempts are over (their outcome is durable or was refused): free their slots."""
        with self.changed:
            for attempt in attempts:
                if self.held.get(attempt.key) is attempt:
                    self._drop(attempt.key)
            self.changed.notify_all()

    def wake(self) -> None:
        """Make every waiter look at its predicate again now: for a change the state does not
        see itself (the worker stopping), so no loop sleeps out its idle wait first."""
        with self.changed:
            self.changed.notify_all()

    def _count_decided(self, attempt: Attempt) -> None:
        if attempt.phase is Phase.COMPLETING:
            self._completing += 1

    def _drop(self, key: AttemptKey) -> None:
        """Forget the attempt held under `key`, if any (call under the lock)."""
        attempt = self.held.pop(key, None)
        if attempt is not None and attempt.phase is Phase.COMPLETING:
            self._completing -= 1

    def wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Block until `predicate()` (evaluated under the lock) holds; False on timeout."""
        with self.changed:
            return self.changed.wait_for(predicate, timeout_s)
