"""Celery peer: `celery -A celery_tasks worker` with default settings on a Redis broker.

    .venv/bin/python benchmarks/peers/celery_bench.py --workloads w1,spike --repeat 3

Settings (only the ones the issue names): one prefork worker with concurrency 1; a prefork pool
of 2 (`-c 2`); two single-process workers (two `-c 1` workers, distinct node names).
Priorities: the task's `priority` argument (Redis emulates it with one list per step of
[0, 3, 6, 9], 0 first): CRITICAL = 0, LOW = 9.
"""

from __future__ import annotations

from datetime import UTC, datetime

from harness import BIN, Peer, Setting, cli_main


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class CeleryPeer(Peer):
    name = "celery"
    dist = "celery"
    default_enqueue_rate = 1500.0
    w1_settings = ("1proc", "2x1proc")  # prefork2 was tried too: no faster than 1proc (see README)
    spike_settings = ("prefork2", "2x1proc")
    priority_setting = "prefork2"
    spread_setting = "prefork2"
    backlog_setting = "1proc"

    def __init__(self, redis_url: str) -> None:
        super().__init__(redis_url)
        import celery_tasks

        self.noop = celery_tasks.noop
        self.app = celery_tasks.app

    def settings(self) -> dict[str, Setting]:
        base = [str(BIN / "celery"), "-A", "celery_tasks", "worker", "-P", "prefork"]
        return {
            "1proc": Setting(
                "1proc",
                [[*base, "-c", "1", "-n", "w1@%h"]],
                1,
                "one worker, prefork pool of 1 (a parent and one child process)",
            ),
            "prefork2": Setting("prefork2", [[*base, "-c", "2", "-n", "w1@%h"]], 1, "one worker, prefork pool of 2"),
            "2x1proc": Setting(
                "2x1proc",
                [[*base, "-c", "1", "-n", "w1@%h"], [*base, "-c", "1", "-n", "w2@%h"]],
                2,
                "two single-process workers (each -c 1)",
            ),
        }

    def enqueue(self, ids):
        delay = self.noop.delay
        for i in ids:
            delay(i)

    def schedule(self, items):
        apply = self.noop.apply_async
        for i, due in items:
            apply((i,), eta=_utc(due))

    def schedule_priority(self, items):
        apply = self.noop.apply_async
        for i, due, critical in items:
            apply((i,), eta=_utc(due), priority=0 if critical else 9)

    def backlog_fetched(self) -> bool:
        # Every ETA message moved from the queue lists into the worker (and Redis' unacked hash).
        client = self.app.connection().default_channel.client
        return sum(client.llen(k) for k in ("celery", *(f"celery\x06\x16{p}" for p in (3, 6, 9)))) == 0


if __name__ == "__main__":
    cli_main(CeleryPeer)
