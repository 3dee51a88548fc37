"""Dramatiq peer: `dramatiq dramatiq_tasks` on a RedisBroker with default middleware.

    .venv/bin/python benchmarks/peers/dramatiq_bench.py --workloads w1,spike --repeat 3

Scheduling: `send_with_options(delay=ms)` with delay = due - now (Dramatiq turns it into an
eta). Priorities: per actor (`noop_critical` priority 0, `noop_low` 100, same queue and body).
"""

from __future__ import annotations

import time
from pathlib import Path

from harness import BIN, Peer, Setting, cli_main


class DramatiqPeer(Peer):
    name = "dramatiq"
    dist = "dramatiq"
    default_enqueue_rate = 2000.0
    w1_settings = ("1proc", "2core")
    spike_settings = ("2core",)
    priority_setting = "2core"
    spread_setting = "2core"
    backlog_setting = "1proc"

    def __init__(self, redis_url: str) -> None:
        super().__init__(redis_url)
        import dramatiq_tasks

        self.tasks = dramatiq_tasks

    def settings(self) -> dict[str, Setting]:
        base = [str(BIN / "dramatiq"), "dramatiq_tasks"]
        return {
            "1proc": Setting(
                "1proc",
                [[*base, "--processes", "1", "--threads", "8"]],
                1,
                "one worker process, 8 threads (the default thread count)",
            ),
            "2core": Setting(
                "2core", [[*base, "--processes", "2", "--threads", "8"]], 2, "two worker processes x 8 threads"
            ),
            # alternatives tried for the 2-core setting
            "2p1t": Setting("2p1t", [[*base, "--processes", "2", "--threads", "1"]], 2, "2 processes x 1 thread"),
            "2p2t": Setting("2p2t", [[*base, "--processes", "2", "--threads", "2"]], 2, "2 processes x 2 threads"),
            "1p1t": Setting("1p1t", [[*base, "--processes", "1", "--threads", "1"]], 1, "1 process x 1 thread"),
        }

    def ready_count(self, run_dir: Path) -> int:
        return sum(
            p.read_text(errors="replace").count("Worker process is ready for action.")
            for p in run_dir.glob("worker-*.log")
        )

    def enqueue(self, ids):
        send = self.tasks.noop.send
        for i in ids:
            send(i)

    def schedule(self, items):
        send = self.tasks.noop.send_with_options
        for i, due in items:
            send(args=(i,), delay=max(0, round((due - time.time()) * 1000)))

    def schedule_priority(self, items):
        crit = self.tasks.noop_critical.send_with_options
        low = self.tasks.noop_low.send_with_options
        for i, due, critical in items:
            (crit if critical else low)(args=(i,), delay=max(0, round((due - time.time()) * 1000)))


if __name__ == "__main__":
    cli_main(DramatiqPeer)
