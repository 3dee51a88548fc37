"""The one no-op task body every peer runs: record the task's id and timestamps, nothing else.

Each execution appends one line, `<id> <start> <end> <pid>\\n` (wall-clock seconds), to
`$PEER_BENCH_LOG_DIR/executed.log` with a single O_APPEND write, so lines from any number of
processes, threads or forked children never interleave. The harness counts and parses the
file: exactly-once (no id missing, none twice) and every timing come from here.
"""

from __future__ import annotations

import os
import threading
import time

_fd: int | None = None
_lock = threading.Lock()


def _open() -> int:
    global _fd
    with _lock:
        if _fd is None:
            path = os.path.join(os.environ["PEER_BENCH_LOG_DIR"], "executed.log")
            _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    return _fd


def record(task_id: int) -> None:
    start = time.time()
    fd = _fd if _fd is not None else _open()
    os.write(fd, f"{task_id} {start:.6f} {time.time():.6f} {os.getpid()}\n".encode())


def mark_ready(tag: str = "") -> None:
    """Worker start-up hook: one file per ready worker process/thread."""
    directory = os.environ.get("PEER_BENCH_LOG_DIR")
    if directory:
        name = f"ready-{os.getpid()}-{threading.get_ident()}{tag}"
        open(os.path.join(directory, name), "w").close()


def redis_url() -> str:
    return os.environ.get("PEER_BENCH_REDIS_URL", "redis://127.0.0.1:6399/0")
