"""Group commit: concurrent callers share one store transaction, each getting its own outcome.

    group = GroupCommit(commit)          # commit(items) -> one outcome (value or exception) per item
    outcome = group(item)                # blocks until `item` is committed; raises its exception

Leader and followers. A caller that finds a free place (fewer than `parallel` commits in flight;
one for SQLite, whose writers take turns anyway) leads at once, a group of itself: a lone caller
waits for nothing but its own commit. A caller that finds none waits; when a commit ends, the
callers that arrived meanwhile become the next group (up to `MAX_GROUP`), and the first of them
is woken to commit it. So a group is exactly the callers that arrived while the store was busy:
the busier the store, the larger the groups, and no caller ever waits for a timer.

Threads (and gevent's patched threads) only; asyncio callers go through `off_loop`, which runs the
blocking call on a thread of `SUBMIT_THREADS` so the event loop never waits for a commit.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

from jobq.errors import StoreUnavailable

T = TypeVar("T")
R = TypeVar("R")

#: Largest group one commit takes; callers beyond it wait for the next.
MAX_GROUP = 256
#: Threads that carry asyncio callers' submissions: as many groups-worth of callers can wait at once.
SUBMIT_THREADS = 64


class _Slot(Generic[T, R]):
    __slots__ = ("done", "error", "event", "group", "item", "value")

    def __init__(self, item: T) -> None:
        self.item = item
        self.event: threading.Event | None = None  # only a caller that waits needs one
        self.group: list[_Slot[T, R]] | None = None  # promoted: the group this caller commits
        self.done = False
        self.value: R | None = None
        self.error: BaseException | None = None

    def outcome(self) -> R:
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]  # set together with `done`


class GroupCommit(Generic[T, R]):
    """Calls `commit(items)` for groups of concurrent callers (see the module docstring).

    `commit` receives the items in arrival order and returns one outcome per item, in that order:
    a value, or an exception for that caller alone. When `commit` itself raises, every caller of
    the group gets that exception. `after(items, outcomes)`, when given, runs once the next group
    may start committing (the store is free again) and before the callers are answered: what must
    follow a commit but need not hold the store up (indexing, publishing) overlaps the next
    group's commit. It returns the outcomes to deliver. Thread-safe; one instance per store."""

    def __init__(
        self,
        commit: Callable[[list[T]], Sequence[R | BaseException]],
        after: Callable[[list[T], list[R | BaseException]], list[R | BaseException]] | None = None,
        *,
        parallel: int = 1,
        max_group: int = MAX_GROUP,
    ) -> None:
        self._commit = commit
        self._after = after
        self._parallel = parallel
        self._max = max_group
        self._lock = threading.Lock()
        self._waiting: list[_Slot[T, R]] = []
        self._in_flight = 0  # groups committing now; callers wait only when `parallel` are
        self.groups = 0  # commits made (for tests and benchmarks: mean group size = items / groups)
        self.items = 0

    @property
    def waiting(self) -> int:
        """Callers queued for a coming group."""
        with self._lock:
            return len(self._waiting)

    def __call__(self, item: T) -> R:
        slot: _Slot[T, R] = _Slot(item)
        with self._lock:
            self._waiting.append(slot)
            # Invariant: callers wait only while `parallel` groups are in flight, so a caller that
            # finds a free place is alone in the queue and leads a group of itself.
            group = self._take() if self._in_flight < self._parallel else None
            if group is None:
                slot.event = threading.Event()
        if group is None:
            assert slot.event is not None
            slot.event.wait()
            if slot.done:
                return slot.outcome()
            group = slot.group
            assert group is not None
        self._lead(group)
        return slot.outcome()

    def _take(self) -> list[_Slot[T, R]]:
        """Under the lock: the next group, in flight from now on."""
        group = self._waiting[: self._max]
        del self._waiting[: self._max]
        self._in_flight += 1
        return group

    def _lead(self, group: list[_Slot[T, R]]) -> None:
        items = [s.item for s in group]
        try:
            try:
                outcomes = list(self._commit(items))
                if len(outcomes) != len(group):
                    raise RuntimeError(f"group commit returned {len(outcomes)} outcomes for {len(group)} items")
            except Exception as exc:
                outcomes = [exc] * len(group)
            finally:
                self._hand_over(len(group))
            if self._after is not None:
                try:
                    outcomes = self._after(items, outcomes)
                except Exception as exc:
                    outcomes = [exc] * len(group)
        except BaseException:
            # The leading thread is being torn down (KeyboardInterrupt, a greenlet kill) mid-commit:
            # the others must not wait for an answer that will never come. Whether it committed is
            # unknown, as for a connection lost during a commit.
            lost = StoreUnavailable("the submission leading this group was interrupted; its outcome is unknown")
            self._answer(group, [lost] * len(group))
            raise
        self._answer(group, outcomes)

    def _hand_over(self, size: int) -> None:
        """A commit ended: the callers that arrived meanwhile go in the next groups, each led by
        its first caller."""
        with self._lock:
            self.groups += 1
            self.items += size
            self._in_flight -= 1
            while self._waiting and self._in_flight < self._parallel:
                group = self._take()
                group[0].group = group
                assert group[0].event is not None  # it queued: it waits
                group[0].event.set()

    @staticmethod
    def _answer(group: list[_Slot[T, R]], outcomes: Sequence[R | BaseException]) -> None:
        for slot, outcome in zip(group, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                slot.error = outcome
            else:
                slot.value = outcome
            slot.done = True
            if slot.event is not None:
                slot.event.set()


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _submit_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=SUBMIT_THREADS, thread_name_prefix="jobq-submit")
        return _pool


async def off_loop(call: Callable[[], R]) -> R:
    """`call()` on one of the submission threads, awaited without blocking the event loop. The
    caller's context variables (its current trace span) go with it. A cancelled await does not
    cancel a submission already under way: it completes, and its job exists."""
    context = contextvars.copy_context()
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_submit_pool(), functools.partial(context.run, call))
