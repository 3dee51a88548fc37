"""The worker: a consumer, a pool, a completer and a lease monitor around one `WorkerState`.

Every decision lives in those parts and takes `now`; this module is the runtime that moves
data between them: the consumer loop (here), a completer thread, a monitor thread and, with
`--autoscale`, an autoscaler thread. Driven by hand instead (`background=False`), `run_once`,
`complete_once`, `monitor_once` and `autoscale_once` step the same core with no threads of its
own, as the simulation does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from jobq.daemons.base import MAX_BACKOFF_S, Daemon
from jobq.daemons.worker.attempt import Attempt, AttemptKey, Outcome, Phase, completes_job, failure, hand_back, success
from jobq.daemons.worker.autoscale import Autoscaler, Change, Signals, recommended_workers
from jobq.daemons.worker.broker import BrokerLane
from jobq.daemons.worker.completer import Completer
from jobq.daemons.worker.consumer import Consumer
from jobq.daemons.worker.monitor import LeaseMonitor
from jobq.daemons.worker.pools import Pool, pool_for
from jobq.daemons.worker.state import WorkerState
from jobq.deployment import Deployment
from jobq.ids import new_worker_id
from jobq.metrics import METRICS, Gauge
from jobq.ports import HealthCheck
from jobq.registry import ERROR_MAX_CHARS, RUNNING_MAX, Running
from jobq.tasks import TaskRegistry, WebhookCaller

MONITOR_TICK_S = 0.5
COMPLETE_GATHER_S = 0.002  # while other runs execute, outcomes this close together share a batch
REFILL_WAIT_S = 0.005  # how long a busy worker waits for half its slots before consuming
DRAIN_S = 10.0  # at shutdown, how long outcomes may take to become durable before the leases are left to expire
UNHEALTHY_AFTER_S = 60.0  # outcome writes failing this long, or every slot lost, turn /healthz red
AUTOSCALE_TICK_S = 0.5  # how often the autoscaler reads the backlog (one broker call per queue)
COMPLETER_IDLE_S = 0.2  # the completer's longest wait with nothing to write; any change to the state wakes it


POOL_SIZE = Gauge("jobq_worker_pool_size", "Tasks the worker's pool runs at once (changes with --autoscale).")


class Worker(Daemon):
    name = "worker"

    def __init__(
        self,
        deployment: Deployment,
        registry: TaskRegistry,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int | None = None,
        worker_id: str | None = None,
        webhook: WebhookCaller | None = None,
        pool: Pool | str | None = None,
        autoscale: tuple[int, int] | None = None,
        background: bool = True,
    ) -> None:
        super().__init__(deployment)
        self.registry = registry
        self.queues = list(queues or self.settings.queues)
        bounds = autoscale or self.settings.autoscale
        self.autoscaler = Autoscaler(*bounds) if bounds else None
        # With autoscaling the pool starts at the concurrency kept within MIN..MAX, and
        # `concurrency` then follows the pool size.
        start = concurrency or self.settings.concurrency
        self.concurrency = min(max(start, bounds[1]), bounds[0]) if bounds else start
        self.worker_id = worker_id or new_worker_id("worker")
        self.daemon_id = self.worker_id
        self.failed = 0  # attempts that ended in an error (retried or not), for the registry
        self.poll_s = 0.1
        self.background = background
        lease_ms = round(self.settings.lease_s * 1000)
        self.state = WorkerState(self.concurrency)
        if pool is None or isinstance(pool, str):
            pool = pool_for(self.settings.with_overrides(pool=pool) if pool else self.settings, registry)
        self.pool = pool
        self.consumer = Consumer(
            deployment,
            self.state,
            self.pool,
            registry,
            worker_id=self.worker_id,
            queues=self.queues,
            lease_ms=lease_ms,
            webhook=webhook,
            on_done=self.finished,
        )
        self.lane = BrokerLane(deployment.transport, background=background)
        self.completer = Completer(deployment, self.state, self.lane, worker_id=self.worker_id)
        self.monitor = LeaseMonitor(
            deployment,
            self.state,
            self.pool,
            self.lane,
            worker_id=self.worker_id,
            lease_ms=lease_ms,
            heartbeat_ms=round(self.settings.heartbeat_s * 1000),
        )
        self.scaling_log: list[tuple[int, int, int, str]] = []  # (at ms, from, to, reason) of every change
        self.recommended_workers = 1
        self._export_gauges()
        self._threads: list[threading.Thread] = []
        self._started = False
        self._start_lock = threading.Lock()
        self._stopping = threading.Event()  # the completer and monitor threads stop once it is set

    # -- the core, one step at a time -----------------------------------------------------------

    def run_once(self, now_ms: int, wait_s: float = 0.0) -> int:
        """Take up to the free slots' worth of deliveries and start them."""
        self.start()
        return self.consumer.take(wait_s)

    def complete_once(self, now_ms: int) -> int:
        """Write the outcomes that are due; returns how many were settled."""
        return self.completer.complete(now_ms)

    def monitor_once(self, now_ms: int) -> None:
        """Apply time limits and renew the leases that are due."""
        self.monitor.check(now_ms)

    def autoscale_once(self, now_ms: int) -> Change | None:
        """Read the backlog and resize the pool when the autoscaler says so (see `autoscale`)."""
        if self.autoscaler is None:
            return None
        waiting = 0
        messages = 0
        transport = self.d.transport
        for queue in self.queues:
            depth = transport.queue_depth(queue)
            waiting += depth.waiting
            messages += max(transport.depth(queue), depth.waiting)
        self.recommended_workers = recommended_workers(messages, self.autoscaler.maximum)
        busy = self.state.occupied()
        late_s = max(0, self.state.take_lateness()) / 1000
        change = self.autoscaler.decide(Signals(waiting, busy, self.concurrency, late_s), now_ms)
        if change is not None:
            self.resize(change.size, change.reason, now_ms)
        return change

    def resize(self, size: int, reason: str = "asked", now_ms: int | None = None) -> None:
        """Set the pool size (the number of slots): logged, counted and exported."""
        before = self.concurrency
        if size == before:
            return
        self.concurrency = size
        self.state.resize(size)
        if self._started:
            self.pool.start(size)
        at = self.clock.now_ms() if now_ms is None else now_ms
        self.scaling_log.append((at, before, size, reason))
        METRICS.autoscale.inc(direction="up" if size > before else "down")
        POOL_SIZE.set(size)
        self.log.info("autoscale: pool %d -> %d (%s)", before, size, reason)

    def finished(self, key: AttemptKey, outcome: Outcome) -> None:
        """The pool's report of an execution: decide its outcome write (any thread)."""
        now = self.clock.now_ms()

        def decide(attempt: Attempt) -> None:
            if outcome.ok:
                move = success(
                    attempt.run, outcome.result, self.worker_id, now, completes_job(attempt.job, attempt.run)
                )
                attempt.decide(move, "SUCCEEDED", None, now)
            else:
                move, kind = failure(attempt.run, attempt.job, outcome, self.worker_id, now)
                attempt.decide(move, kind, outcome.error, now)
                self.failed += 1
                self.last_error, self.last_error_ms = (outcome.error or "")[:ERROR_MAX_CHARS], now

        self.state.finish(key, decide)

    def report(self) -> dict[str, object]:
        """The registry's view: slots, what runs now (attempts still executing), outcomes so far."""
        attempts = sorted(self.state.snapshot(), key=lambda a: a.started_ms)
        running = tuple(
            Running(a.run.run_id, a.task.name, a.run.attempt, a.started_ms)
            for a in attempts
            if a.phase is Phase.EXECUTING
        )
        return {
            **super().report(),
            "done": self.completed,
            "failures": self.failed,
            "queues": tuple(self.queues),
            "pool": getattr(self.pool, "name", None),
            "concurrency": self.concurrency,
            "busy": self.state.taken(),
            "free": max(0, self.state.free()),
            "lost": self.state.lost_slots(),
            "running": running[:RUNNING_MAX],
        }

    @property
    def completed(self) -> int:
        return self.completer.completed

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Register the served tasks and publish their declarations to the task catalogue, start
        the pool and (in the background) the completer and the monitor. Idempotent; raises when
        the store cannot be reached (the loop retries)."""
        with self._start_lock:
            if self._started:
                return
            now = self.clock.now_ms()
            self.store.register_worker(self.worker_id, sorted(self.registry.names()), self.queues, now)
            self.store.publish_tasks([t.info(self.worker_id, now) for t in self.registry])
            self.pool.start(self.concurrency)
            self.lane.start()
            if self.background:
                loops = [(self._completer_loop, "jobq-completer"), (self._monitor_loop, "jobq-monitor")]
                if self.autoscaler is not None:
                    loops.append((self._autoscale_loop, "jobq-autoscale"))
                for target, name in loops:
                    thread = threading.Thread(target=target, name=name, daemon=True)
                    thread.start()
                    self._threads.append(thread)
            self._started = True
            scaling = f", autoscaling {self.autoscaler.minimum}..{self.autoscaler.maximum}" if self.autoscaler else ""
            self.log.info(
                "worker %s serving %s with %d slots (%s pool%s)",
                self.worker_id,
                ",".join(self.queues),
                self.concurrency,
                getattr(self.pool, "name", "?"),
                scaling,
            )

    def run_forever(self, stop: threading.Event) -> None:
        failures = 0
        while not stop.is_set():
            self.last_beat = time.monotonic()
            if self._started:
                self._wait_for_slots(stop)
                if stop.is_set():
                    break
            try:
                self.start()
                self.consumer.take(wait_s=self.poll_s)
                failures = 0
                self.failing_since = None
            except Exception as exc:
                failures += 1
                if self.failing_since is None:
                    self.failing_since = time.monotonic()
                self.note_error(exc)
                METRICS.loop_errors.inc(daemon=self.name)
                self.log.exception("consume failed (%d in a row)", failures)
                stop.wait(min(MAX_BACKOFF_S, 0.25 * 2**failures))
        if self._started:
            self.shutdown()

    def _wait_for_slots(self, stop: threading.Event) -> None:
        """Until a slot is free or a held delivery is due; then, while busy, a moment more for half
        the slots, since every consume and start batch costs about as much as a few dozen runs.
        Never past the next held delivery's not-before time: it starts on time."""
        while self.state.free() <= 0 and not stop.is_set():
            hold_s = self._until_held_s()
            if hold_s is not None and hold_s <= 0:
                return
            self.state.wait(lambda: self.state.free() > 0, 0.2 if hold_s is None else min(0.2, hold_s))
            self.last_beat = time.monotonic()
        refill_at = max(1, self.concurrency // 2)
        if self.state.free() < refill_at and not stop.is_set():
            hold_s = self._until_held_s()
            wait_s = REFILL_WAIT_S if hold_s is None else max(0.0, min(REFILL_WAIT_S, hold_s))
            if wait_s > 0:
                self.state.wait(lambda: self.state.free() >= refill_at, wait_s)

    def _until_held_s(self) -> float | None:
        """Seconds until the earliest held delivery may start; None when none is held."""
        due_ms = self.consumer.next_due_ms()
        return None if due_ms is None else (due_ms - self.clock.now_ms()) / 1000

    def _completer_loop(self) -> None:
        while True:
            now = self.clock.now_ms()
            try:
                done = self.completer.complete(now)
            except Exception:  # a bug, not an outage (those are retried inside): keep the loop alive
                METRICS.loop_errors.inc(daemon="completer")
                self.log.exception("completer pass failed")
                done = 0
            if self._stopping.is_set() and self.state.busy() == 0:
                return
            if done:
                continue
            next_ms = self.state.next_write_ms()
            timeout_s = COMPLETER_IDLE_S if next_ms is None else min(COMPLETER_IDLE_S, max(0.0, (next_ms - now) / 1000))
            self.state.wait(self._write_due, timeout_s)
            if self.state.executing() > 0:
                time.sleep(COMPLETE_GATHER_S)

    def _autoscale_loop(self) -> None:
        while not self._stopping.wait(AUTOSCALE_TICK_S):
            try:
                self.autoscale_once(self.clock.now_ms())
            except Exception:  # the broker is unreachable: keep the size, try again next tick
                METRICS.loop_errors.inc(daemon="autoscale")
                self.log.exception("autoscale pass failed")

    def _export_gauges(self) -> None:
        state = self.state
        POOL_SIZE.set(self.concurrency)

        def slots() -> dict[tuple[str, ...], float]:
            lost = state.lost_slots()
            return {
                ("busy",): state.taken(),
                ("free",): state.free(),
                ("lost",): lost,
                ("completing",): state.completing_count(),
            }

        METRICS.register(
            Gauge(
                "jobq_worker_slots",
                "The worker's slots: busy, free, or lost to a stuck task; completing: attempts whose outcome"
                " is being written (they hold no slot up to the pool size).",
                ("state",),
                slots,
            )
        )
        METRICS.register(POOL_SIZE)
        METRICS.register(
            Gauge(
                "jobq_worker_recommended_workers",
                "Workers needed for every message of this worker's queues at its largest pool size (autoscale MAX).",
                source=lambda: {(): float(self.recommended_workers)},
            )
        )

    def _write_due(self) -> bool:
        return bool(self.state.completing(self.clock.now_ms(), 1)) or self._stopping.is_set()

    def _monitor_loop(self) -> None:
        while not self._stopping.wait(MONITOR_TICK_S):
            try:
                self.monitor.check(self.clock.now_ms())
            except Exception:
                METRICS.loop_errors.inc(daemon="monitor")
                self.log.exception("heartbeat pass failed")

    def healthy(self, max_silence_s: float = 60.0) -> bool:
        """The loop comes round; outcome writes have not been failing for long; not every slot is
        lost to a task past its time limit; and, with a slot free, the transport reaches the broker."""
        if not super().healthy(max_silence_s):
            return False
        failing_since = self.completer.failing_since_ms
        if failing_since is not None and self.clock.now_ms() - failing_since > UNHEALTHY_AFTER_S * 1000:
            return False
        if self.state.lost_slots() >= self.concurrency:
            return False
        transport = self.d.transport
        busy = self.state.free() <= 0
        return busy or not isinstance(transport, HealthCheck) or transport.health_check(max_silence_s)

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        """Block until nothing is held (every started attempt finished and its outcome is settled)
        and every ack and extension has been handed to the broker."""
        deadline = time.monotonic() + timeout_s
        if not self.state.wait(lambda: not self.state.held, timeout_s):
            return False
        return self.lane.drain(max(0.0, deadline - time.monotonic()))

    def shutdown(self) -> None:
        """Stop: wait up to `shutdown_grace_s` for running tasks, hand the rest back (fence+1,
        SCHEDULED now, no attempt used) so another worker runs them without waiting for a lease,
        and let every outcome become durable before leaving."""
        returned = self.consumer.return_held()
        if returned:
            self.log.info("handed %d held deliveries back to the broker", returned)
        grace = self.settings.shutdown_grace_s
        if not self.state.wait(lambda: self.state.executing() == 0, grace):
            now = self.clock.now_ms()
            left = [a for a in self.state.snapshot() if a.phase is Phase.EXECUTING]
            for attempt in left:

                def decide(a: Attempt) -> None:
                    move, kind = hand_back(a.run, a.job, self.worker_id, now, "the worker shut down while it ran")
                    a.decide(move, kind, move.changes.get("last_error"), now)

                if self.state.give_up(attempt, decide):
                    attempt.ctx.lease_lost.set()
                    if self.pool.stop(attempt):
                        self.state.recover(attempt.key)
            self.log.warning("handing back %d unfinished runs", len(left))
        if self.background:
            if not self.wait_idle(DRAIN_S):
                self.log.error("%d outcomes could not be written; their leases will expire", self.state.busy())
        else:
            while self.completer.complete(self.clock.now_ms()):
                pass
        self._stopping.set()
        self.state.wake()  # the completer waits on the state, not on `_stopping`
        for thread in self._threads:
            thread.join(timeout=2)
        if not self.lane.drain(DRAIN_S):
            self.log.warning("the broker did not take every ack in time; those messages come back and are dropped")
        self.lane.close(1)
        self.pool.close(0)
        self.log.info("worker %s stopped after %d runs", self.worker_id, self.completed)
