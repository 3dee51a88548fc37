"""Huey peer: `huey_consumer huey_tasks.huey` on RedisHuey with default settings except `-q`
(Huey logs every execution at INFO by default; the others log none at their defaults).

    .venv/bin/python benchmarks/peers/huey_bench.py --workloads w1,spike --repeat 3

Scheduling: `noop.schedule(args=(i,), eta=<aware UTC datetime>)`; the consumer's scheduler
moves due tasks to the queue once a second (its default interval). Priorities need Huey's
PriorityRedisHuey storage: the priority workload alone runs on `huey_tasks.huey_prio`
(CRITICAL priority=10, LOW none; higher runs first).
"""

from __future__ import annotations

from datetime import UTC, datetime

from harness import BIN, Peer, Setting, cli_main


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class HueyPeer(Peer):
    name = "huey"
    dist = "huey"
    default_enqueue_rate = 3000.0
    w1_settings = ("1proc", "2core")
    spike_settings = ("2core",)
    priority_setting = "2core"
    spread_setting = "2core"
    backlog_setting = "1proc"
    two_core = ["-w", "2", "-k", "process"]

    def __init__(self, redis_url: str) -> None:
        super().__init__(redis_url)
        import huey_tasks

        self.tasks = huey_tasks

    def _setting(self, name, instance, args, expect, note):
        return Setting(name, [[str(BIN / "huey_consumer"), f"huey_tasks.{instance}", *args, "-q"]], expect, note)

    def settings(self):
        return {
            "1proc": self._setting(
                "1proc",
                "huey",
                ["-w", "1", "-k", "thread"],
                1,
                "one consumer process, one worker thread (the defaults)",
            ),
            "2core": self._setting(
                "2core", "huey", self.two_core, int(self.two_core[1]), f"consumer {' '.join(self.two_core)}"
            ),
            # alternatives tried for the 2-core setting
            "2thread": self._setting("2thread", "huey", ["-w", "2", "-k", "thread"], 2, "-w 2 -k thread"),
            "4thread": self._setting("4thread", "huey", ["-w", "4", "-k", "thread"], 4, "-w 4 -k thread"),
            "4process": self._setting("4process", "huey", ["-w", "4", "-k", "process"], 4, "-w 4 -k process"),
        }

    def priority_settings(self):
        return self._setting(
            "2core-prio",
            "huey_prio",
            self.two_core,
            int(self.two_core[1]),
            f"PriorityRedisHuey, consumer {' '.join(self.two_core)}",
        )

    def enqueue(self, ids):
        noop = self.tasks.noop
        for i in ids:
            noop(i)

    def schedule(self, items):
        schedule = self.tasks.noop.schedule
        for i, due in items:
            schedule(args=(i,), eta=_utc(due))

    def schedule_priority(self, items):
        schedule = self.tasks.noop_prio.schedule
        for i, due, critical in items:
            schedule(args=(i,), eta=_utc(due), priority=10 if critical else None)


if __name__ == "__main__":
    cli_main(HueyPeer)
