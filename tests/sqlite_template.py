"""A fresh jobq SQLite file for a test, copied from one made once per test process.

Creating a store's file costs ~15 ms, nearly all of it waiting on fsync (the schema, the switch to
WAL, the checkpoint when the last connection closes); a copy costs under a millisecond. The
template is made by jobq itself (`connect` and `close` on a new file, every table of the store,
index, transport and history), so a copy is exactly the file a first `connect` would leave. Each
test still gets a file of its own. Tests about creating or upgrading a file make theirs as before.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path

from jobq.settings import Settings
from jobq.wiring import connect


@functools.cache
def _template() -> Path:
    directory = Path(tempfile.mkdtemp(prefix="jobq-sqlite-template-"))
    atexit.register(_remove, directory, os.getpid())
    path = directory / "jobq.db"
    connect(Settings.load({"store": f"sqlite:///{path}", "history_flush_s": 0}, env={})).close()
    leftovers = sorted(p.name for p in directory.iterdir() if p != path)
    assert not leftovers, f"closing the template left {leftovers} behind"  # the WAL is checkpointed away
    return path


def _remove(directory: Path, owner_pid: int) -> None:
    if os.getpid() == owner_pid:  # not from a forked child that inherited the handler
        shutil.rmtree(directory, ignore_errors=True)


def fresh_sqlite(path: Path) -> Path:
    """Put a new jobq database at `path` unless one is there (a test that opens its store again),
    and return `path`."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_template(), path)
    return path
