"""The prefork pool: tasks run in child processes; the parent alone talks to the store and broker.

Each slot is a child process forked from the worker (so it has the worker's imported tasks) and
a thread in the parent that feeds it one attempt at a time over a pipe and reads back the
outcome. The parent keeps every lease: it renews leases while children run, forwards
`lease_lost` and `cancelled` to the child running the attempt, and applies time limits:

- soft limit: SIGUSR1 to the child, whose handler raises `SoftTimeLimitExceeded` in the task
  (it interrupts a `time.sleep` or a blocking read, unlike an asynchronous exception);
- hard limit: SIGKILL to the child. The slot is free at once; a new child is forked for it.

A child that dies while it runs an attempt (a segfault, the OOM killer, `os._exit`) fails that
attempt with `WorkerLost` and the exit status, and the slot forks a new child. Children are
recycled between tasks after `max_tasks_per_child` tasks or once their resident memory passes
`max_memory_per_child_kib` (KiB). A child whose parent dies exits within a second.

Children are not forked by the worker but by a zygote: a process the pool forks when it is built,
before the worker starts its threads or opens its store (the CLI builds the pool first). A fork
copies every lock as it is at that instant, and a worker's threads hold some all the time (SQLite's
allocator mutex whenever a thread is inside SQLite): a child forked from the worker itself hung
for ever in its first `sqlite3.connect` about once in a hundred forks under load. The zygote has
one thread and does nothing but fork, so its children start with every lock free. The worker
talks to it over a socket (a fork request carries the child's end of its pipe; the zygote answers
with the pid, and with the exit status when asked), and the zygote exits when the worker does.

Tasks are looked up by name in the registry the child inherited; a task the registry does not
hold (the built-in webhook task, built per run) runs on a thread in the parent: it is I/O, and
its HTTP client with its connection pool lives there. Outcomes travel back as data: the return
value (already JSON), the error text, and the exception itself when it pickles (else a stand-in
of the same class name, which is what retry policies match on).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import pickle
import queue
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any

from jobq.daemons.worker.attempt import Attempt, AttemptKey, Outcome
from jobq.daemons.worker.execution import execute, failed
from jobq.daemons.worker.pools import Done, PoolOptions
from jobq.errors import Fail, Retry, SoftTimeLimitExceeded
from jobq.tasks import TaskContext, TaskRegistry

log = logging.getLogger("jobq.worker")

_POLL_S = 0.05  # how often a parent thread looks at its child and the attempt's flags while it runs
_ORPHAN_CHECK_S = 1.0  # how often a child (and the zygote) checks that its parent is alive
_ALIVE_CHECK_S = 1.0  # how often a parent thread asks whether its busy child still lives
_CLOSE_GRACE_S = 2.0  # at close, how long children get to exit before they are killed
_STOP = None
_FLAGS = ("lease_lost", "cancelled")

# --- the child ------------------------------------------------------------------------------


@dataclass
class _Running:
    """What a child is running (read by its signal handler and its pipe reader)."""

    key: AttemptKey | None = None
    ctx: TaskContext | None = None


def _child_main(conn: Connection, registry: TaskRegistry, options: PoolOptions) -> None:
    """A child's life: run one attempt at a time until told to stop, recycled, or orphaned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent decides
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    running = _Running()
    lock = threading.Lock()

    def on_soft_limit(_signum: int, _frame: FrameType | None) -> None:
        if running.key is not None:
            raise SoftTimeLimitExceeded("the soft time limit passed")

    signal.signal(signal.SIGUSR1, on_soft_limit)
    if options.child_init is not None:
        options.child_init()
    parent = os.getppid()
    work: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()

    def read() -> None:
        """Everything the parent sends: attempts (to the main thread) and flags (set at once)."""
        try:
            while True:
                message = conn.recv()
                if message[0] == "flag":
                    with lock:
                        ctx = running.ctx if running.key == message[1] else None
                    if ctx is not None:
                        getattr(ctx, message[2]).set()
                else:
                    work.put(message)
        except (EOFError, OSError):
            work.put(_STOP)

    def watch_parent() -> None:
        while os.getppid() == parent:  # the zygote, which lives as long as the worker
            time.sleep(_ORPHAN_CHECK_S)
        os._exit(1)  # the worker died (kill -9): its leases expire and the reaper retries the runs

    threading.Thread(target=read, name="jobq-child-reader", daemon=True).start()
    threading.Thread(target=watch_parent, name="jobq-child-orphan", daemon=True).start()
    done_count = 0
    while (message := work.get()) is not _STOP:
        _, key, task_name, payload, fields = message
        task = registry.get(task_name)
        ctx = TaskContext(**fields)
        outcome: Outcome | None = None
        try:
            with lock:
                running.key, running.ctx = key, ctx
            try:
                if task is None:
                    outcome = Outcome(error=f"UnknownTask: {task_name!r} is not registered in the child")
                else:
                    outcome = execute(task, ctx, payload)
            finally:
                with lock:
                    running.key = running.ctx = None
        except SoftTimeLimitExceeded as exc:  # the signal landed just after the task returned
            if outcome is None:
                outcome = failed(exc)
        done_count += 1
        retire = _should_retire(done_count, options)
        conn.send(("done", key, _portable(outcome), retire))
        if retire:
            break
    conn.close()


# --- the zygote ----------------------------------------------------------------------------


def _zygote_main(sock: socket.socket, registry: TaskRegistry, options: PoolOptions, worker: int) -> None:
    """Fork a child for each request, and tell the exit status of a child when asked; exit when
    the worker closes its end or dies. One thread, no I/O but this socket: every lock is free."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sock.settimeout(_ORPHAN_CHECK_S)
    while os.getppid() == worker:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 4096, 1)
        except TimeoutError:
            continue
        except OSError:
            return
        if not message:
            return  # the worker closed the pool
        request = pickle.loads(message)
        if request[0] == "fork":
            pid = os.fork()
            if pid == 0:  # the child
                try:
                    sock.close()
                    _child_main(Connection(fds[0]), registry, options)
                finally:
                    for stream in (sys.stdout, sys.stderr):
                        with contextlib.suppress(Exception):
                            stream.flush()
                    os._exit(0)
            os.close(fds[0])
            reply: Any = pid
        else:  # ("poll", pid): its exit code (negative: the signal) once it ended, else None
            for fd in fds:
                os.close(fd)
            try:
                done, status = os.waitpid(request[1], os.WNOHANG)
                reply = os.waitstatus_to_exitcode(status) if done else None
            except ChildProcessError:
                reply = -signal.SIGKILL  # already reaped: it was asked before
        sock.sendall(pickle.dumps(reply))


class _Zygote:
    """The worker's side of the zygote (see the module's docstring)."""

    def __init__(self, registry: TaskRegistry, options: PoolOptions) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        worker = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                _zygote_main(theirs, registry, options, worker)
            finally:
                os._exit(0)
        theirs.close()
        self.pid = pid
        self._sock = ours
        self._lock = threading.Lock()

    def fork(self) -> tuple[_Child, Connection]:
        """A new child, and the worker's end of its pipe."""
        ours, theirs = multiprocessing.Pipe(duplex=True)
        try:
            pid = self._ask(("fork",), [theirs.fileno()])
        finally:
            theirs.close()
        return _Child(pid, self), ours

    def poll(self, pid: int) -> int | None:
        code: int | None = self._ask(("poll", pid))
        return code

    def close(self) -> None:
        with self._lock, contextlib.suppress(OSError):
            self._sock.close()
        deadline = time.monotonic() + _CLOSE_GRACE_S
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(self.pid, os.WNOHANG)[0]:
                    return
            time.sleep(0.01)
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)

    def _ask(self, request: tuple[Any, ...], fds: list[int] | None = None) -> Any:
        with self._lock:
            socket.send_fds(self._sock, [pickle.dumps(request)], fds or [])
            reply = self._sock.recv(4096)
        if not reply:
            raise OSError("the prefork zygote is gone")
        return pickle.loads(reply)


@dataclass
class _Child:
    """A child process of the zygote, as the pool needs it (the parts of `multiprocessing.Process`)."""

    pid: int
    zygote: _Zygote
    exitcode: int | None = None

    def is_alive(self) -> bool:
        if self.exitcode is None:
            with contextlib.suppress(OSError):  # no zygote: it is gone, and the children with it
                self.exitcode = self.zygote.poll(self.pid)
                return self.exitcode is None
            self.exitcode = -signal.SIGKILL
        return False

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def _should_retire(done_count: int, options: PoolOptions) -> bool:
    if options.max_tasks_per_child is not None and done_count >= options.max_tasks_per_child:
        return True
    limit = options.max_memory_per_child_kib
    return limit is not None and rss_kib() > limit


def rss_kib() -> int:
    """This process's resident memory now, in KiB (Linux `/proc`; elsewhere the peak)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _portable(outcome: Outcome) -> dict[str, Any]:
    """The outcome as data that crosses the pipe whatever the exception holds."""
    exc = outcome.exc
    pickled: bytes | None = None
    if exc is not None:
        try:
            pickled = pickle.dumps(exc)
            pickle.loads(pickled)  # some exceptions pickle but cannot be rebuilt
        except Exception:
            pickled = None
    return {
        "result": outcome.result,
        "error": outcome.error,
        "retryable": outcome.retryable,
        "retry_after_s": outcome.retry_after_s,
        "exc": pickled,
        "exc_type": None if exc is None else type(exc).__name__,
        "exc_text": None if exc is None else str(exc),
        "delay_s": getattr(exc, "delay_s", None),
        "fail": isinstance(exc, Fail),
    }


def _rebuilt(data: dict[str, Any]) -> Outcome:
    exc: BaseException | None = None
    if data["exc"] is not None:
        with contextlib.suppress(Exception):
            exc = pickle.loads(data["exc"])
    if exc is None and data["exc_type"] is not None:
        text = data["exc_text"] or ""
        if data["fail"]:
            exc = Fail(text)
        elif data["exc_type"] == "Retry":
            exc = Retry(text, delay_s=data["delay_s"])
        else:
            exc = _stand_in(data["exc_type"])(text)
    return Outcome(
        result=data["result"],
        exc=exc,
        error=data["error"],
        retryable=data["retryable"],
        retry_after_s=data["retry_after_s"],
    )


_STAND_INS: dict[str, type[Exception]] = {}


def _stand_in(name: str) -> type[Exception]:
    """An exception class called `name`: retry policies match errors by class name."""
    if name not in _STAND_INS:
        _STAND_INS[name] = type(name, (Exception,), {"__module__": "jobq.remote"})
    return _STAND_INS[name]


# --- the parent -----------------------------------------------------------------------------


@dataclass(eq=False)
class _Slot:
    """One child and the parent thread that feeds it."""

    number: int
    process: _Child | None = None
    conn: Connection | None = None
    attempt: Attempt | None = None
    killed: set[AttemptKey] = field(default_factory=set)  # attempts stopped by the hard limit


class PreforkPool:
    name = "prefork"

    def __init__(self, options: PoolOptions | None = None) -> None:
        self.options = options or PoolOptions()
        self._registry = self.options.registry or TaskRegistry()
        self._zygote = _Zygote(self._registry, self.options)
        self._work: queue.SimpleQueue[tuple[Attempt, Done] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._slots: list[_Slot] = []
        self._stops = 0  # stop markers queued and not yet taken: slots about to end
        self._serial = 0
        self._closed = False
        self.forks = 0  # children started, replacements included
        self.lost_children = 0  # children that died while running an attempt

    # -- Pool -----------------------------------------------------------------------------------

    def start(self, size: int) -> None:
        new: list[_Slot] = []
        with self._lock:
            if self._closed:
                return
            active = len(self._slots) - self._stops
            for _ in range(active - size):
                self._stops += 1
                self._work.put(_STOP)  # the next idle slot thread takes it and ends its child
            for _ in range(size - active):
                self._serial += 1
                new.append(_Slot(self._serial))
            self._slots.extend(new)
        for slot in new:
            self._fork(slot)
            thread = threading.Thread(target=self._feed, args=(slot,), name=f"jobq-prefork-{slot.number}", daemon=True)
            thread.start()

    def submit(self, attempt: Attempt, done: Done) -> None:
        if self._registry.get(attempt.task.name) is not attempt.task:
            # Not a registered task (a webhook, built per run): it runs on a thread here.
            threading.Thread(
                target=self._run_here, args=(attempt, done), name="jobq-prefork-local", daemon=True
            ).start()
            return
        self._work.put((attempt, done))

    def interrupt(self, attempt: Attempt) -> bool:
        slot = self._slot_running(attempt)
        if slot is None or slot.process is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(slot.process.pid, signal.SIGUSR1)
            return True
        return False

    def stop(self, attempt: Attempt) -> bool:
        slot = self._slot_running(attempt)
        if slot is None:
            return False
        with self._lock:
            slot.killed.add(attempt.key)
        process = slot.process
        if process is not None:
            process.kill()
            process.join(5)
        return True

    def close(self, wait_s: float) -> None:
        with self._lock:
            self._closed = True
            slots = list(self._slots)
            self._stops += len(slots)
        for _ in slots:
            self._work.put(_STOP)
        deadline = time.monotonic() + wait_s
        for slot in slots:
            while slot.attempt is not None and time.monotonic() < deadline:
                time.sleep(_POLL_S)
        # Idle children read end-of-file and exit; busy ones (their runs were handed back) are killed
        # after a short grace shared by all, not one per child.
        ending = [(slot.process, slot.conn) for slot in slots]
        for slot in slots:
            slot.process = slot.conn = None
        for _, conn in ending:
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.close()
        grace = time.monotonic() + _CLOSE_GRACE_S
        for process, _ in ending:
            if process is None:
                continue
            process.join(max(0.0, grace - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(2)
        self._zygote.close()

    # -- figures --------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        with self._lock:
            return len(self._slots) - self._stops

    def child_pids(self) -> list[int]:
        with self._lock:
            return [s.process.pid for s in self._slots if s.process is not None]

    # -- the parent's thread per slot -----------------------------------------------------------

    def _feed(self, slot: _Slot) -> None:
        try:
            while (item := self._work.get()) is not _STOP:
                attempt, done = item
                outcome = self._run(slot, attempt)
                if outcome is not None:
                    done(attempt.key, outcome)
        finally:
            with self._lock:
                if slot in self._slots:
                    self._slots.remove(slot)
                    self._stops = max(0, self._stops - 1)
            self._end_child(slot)

    def _run(self, slot: _Slot, attempt: Attempt) -> Outcome | None:
        """Hand `attempt` to the slot's child and wait for its outcome; None when the hard limit
        killed it (the worker has already written that attempt off)."""
        if slot.process is None or not slot.process.is_alive():
            self._fork(slot)
        conn, process = slot.conn, slot.process
        assert conn is not None and process is not None
        with self._lock:
            slot.attempt = attempt
        ctx = attempt.ctx
        # Every field of the context but its flags, which the child keeps and this thread forwards.
        fields = {f.name: getattr(ctx, f.name) for f in dataclasses.fields(ctx) if f.name not in _FLAGS}
        forwarded: set[str] = set()
        next_check = time.monotonic() + _ALIVE_CHECK_S
        try:
            try:
                conn.send(("run", attempt.key, attempt.task.name, attempt.payload, fields))
                while True:
                    for flag in _FLAGS:
                        if flag not in forwarded and getattr(ctx, flag).is_set():
                            forwarded.add(flag)
                            conn.send(("flag", attempt.key, flag))
                    if conn.poll(_POLL_S):
                        _, key, data, retire = conn.recv()  # EOFError: the child died
                        if retire and not self._closed:
                            self._end_child(slot)
                            self._fork(slot)  # ready before the next attempt arrives
                        return _rebuilt(data) if key == attempt.key else None
                    if time.monotonic() >= next_check:  # a backstop: a death reads as end-of-file
                        next_check = time.monotonic() + _ALIVE_CHECK_S
                        if not process.is_alive():
                            raise EOFError
            except (EOFError, OSError, ValueError):  # ValueError: a pipe closed under us at close
                return self._died(slot, attempt)
        finally:
            with self._lock:
                slot.attempt = None

    def _died(self, slot: _Slot, attempt: Attempt) -> Outcome | None:
        process = slot.process
        if process is not None:
            process.join(5)
        code = None if process is None else process.exitcode
        with self._lock:
            killed = attempt.key in slot.killed
            slot.killed.discard(attempt.key)
        self._end_child(slot)
        if not self._closed:
            self._fork(slot)
        if killed:
            return None
        self.lost_children += 1
        how = f"killed by signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        error = f"WorkerLost: the child process running the task died ({how})"
        log.error("%s; a new child takes its slot", error)
        return Outcome(error=error)

    def _run_here(self, attempt: Attempt, done: Done) -> None:
        try:
            outcome = execute(attempt.task, attempt.ctx, attempt.payload)
        except BaseException as exc:
            outcome = Outcome(exc=exc, error=f"{type(exc).__name__}: {exc}", retryable=False)
        done(attempt.key, outcome)

    # -- children -------------------------------------------------------------------------------

    def _fork(self, slot: _Slot) -> None:
        slot.process, slot.conn = self._zygote.fork()
        self.forks += 1

    def _slot_running(self, attempt: Attempt) -> _Slot | None:
        with self._lock:
            return next((s for s in self._slots if s.attempt is attempt), None)

    @staticmethod
    def _end_child(slot: _Slot) -> None:
        process, conn = slot.process, slot.conn
        slot.process = slot.conn = None
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.close()  # the child reads end-of-file and exits when idle
        if process is not None:
            process.join(2)
            if process.is_alive():
                process.kill()
                process.join(2)
