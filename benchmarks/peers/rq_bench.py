"""RQ peer: `rq worker --with-scheduler` (the default Worker: a forked work horse per job).

    .venv/bin/python benchmarks/peers/rq_bench.py --workloads w1,spike --repeat 3

Workers run with `-q` (RQ logs every job at INFO by default; the others log none at their
defaults). Scheduling: `queue.enqueue_at(<aware UTC datetime>, noop, i)`; RQ keeps due times
in whole seconds, and its scheduler moves due jobs to the queue once a second. RQ has no
per-job priority: its way is queue order, a worker listening on `critical low` empties
`critical` first; the priority workload does that.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from harness import BIN, Peer, Setting, cli_main


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class RQPeer(Peer):
    name = "rq"
    dist = "rq"
    default_enqueue_rate = 1000.0
    w1_settings = ("1proc", "2core")
    spike_settings = ("2core",)
    priority_setting = "2core"
    spread_setting = "2core"
    backlog_setting = "1proc"
    # The default Worker forks a horse per job: ~50 jobs/s here, so 20,000 would take 7 minutes.
    w1_n = {"1proc": 2_000, "pool2": 2_000}

    def __init__(self, redis_url: str) -> None:
        super().__init__(redis_url)
        import rq_tasks
        from redis import Redis
        from rq import Queue

        self.conn = Redis.from_url(redis_url)
        self.noop = rq_tasks.noop
        self.queue = Queue("default", connection=self.conn)
        self.critical = Queue("critical", connection=self.conn)
        self.low = Queue("low", connection=self.conn)

    def _settings(self, queues, suffix=""):
        rq = str(BIN / "rq")
        common = ["-u", self.redis_url, "-q"]
        simple = ["-w", "rq.worker.SimpleWorker"]
        return {
            "1proc": Setting(
                "1proc" + suffix,
                [[rq, "worker", "--with-scheduler", *common, *queues]],
                1,
                "one `rq worker --with-scheduler` (forks a work horse per job)",
            ),
            "pool2": Setting(
                "pool2" + suffix,
                [[rq, "worker-pool", "-n", "2", *common, *queues]],
                2,
                "`rq worker-pool -n 2` (two workers, each forking a horse per job)",
            ),
            "simple1": Setting(
                "simple1" + suffix,
                [[rq, "worker", "--with-scheduler", *simple, *common, *queues]],
                1,
                "one `rq worker -w rq.worker.SimpleWorker` (jobs run in the worker process)",
            ),
            "2core": Setting(
                "2core" + suffix,
                [[rq, "worker-pool", "-n", "2", *simple, *common, *queues]],
                2,
                "`rq worker-pool -n 2 -w rq.worker.SimpleWorker` (two workers, no fork per job)",
            ),
        }

    def settings(self):
        return self._settings(["default"])

    def priority_settings(self):
        return self._settings(["critical", "low"], "-critical-low")[self.priority_setting]

    def ready_count(self, run_dir: Path) -> int:
        return self.conn.scard("rq:workers")

    def enqueue(self, ids):
        enqueue = self.queue.enqueue
        for i in ids:
            enqueue(self.noop, i)

    def schedule(self, items):
        enqueue_at = self.queue.enqueue_at
        for i, due in items:
            enqueue_at(_utc(due), self.noop, i)

    def schedule_priority(self, items):
        for i, due, critical in items:
            (self.critical if critical else self.low).enqueue_at(_utc(due), self.noop, i)


if __name__ == "__main__":
    cli_main(RQPeer)
