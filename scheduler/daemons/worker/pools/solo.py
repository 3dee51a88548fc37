"""The solo pool: each attempt runs inline, in the thread that submits it, one at a time.

For debugging (a breakpoint in a task just works) and the simplest deployments. A time limit
cannot interrupt an inline call; the worker still fences the attempt off when it passes.
"""

from __future__ import annotations

from jobq.daemons.worker.attempt import Attempt
from jobq.daemons.worker.execution import execute
from jobq.daemons.worker.pools import Done


class SoloPool:
    name = "solo"

    def start(self, size: int) -> None:
        pass

    def submit(self, attempt: Attempt, done: Done) -> None:
        done(attempt.key, execute(attempt.task, attempt.ctx, attempt.payload))

    def stop(self, attempt: Attempt) -> bool:
        return False

    def close(self, wait_s: float) -> None:
        pass
