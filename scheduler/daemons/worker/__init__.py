"""Worker: consumes its queues in strict priority order and runs tasks under a fenced lease.

    consumer ──start batch──► pool ──outcome──► completer ──durable write──► ack, slot free
                                 ▲                  ▲
                                 └──── lease monitor (renews running and completing attempts,
                                        applies time limits)

Per delivery: CAS to RUNNING with a 30 s lease (a lost CAS means the run moved on: drop the
message), run the task with a `TaskContext`, then write the outcome with a CAS on the fence and
lease owner — retried until it commits or is refused — then ack. Prefetch never exceeds free
slots, so a long LOW task never holds a CRITICAL message back.
"""

from __future__ import annotations

from jobq.daemons.worker.daemon import Worker

__all__ = ["Worker"]
