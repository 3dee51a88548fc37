"""Real `jobq` daemon processes for end-to-end and crash tests, with their logs kept for failures."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

JOBQ = [sys.executable, "-m", "jobq.cli"]


class Processes:
    def __init__(self, workdir: Path, env: Mapping[str, str]) -> None:
        self.workdir = workdir
        self.env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self,
        name: str,
        *args: str,
        extra_env: Mapping[str, str] | None = None,
        command: Sequence[str] = JOBQ,
    ) -> subprocess.Popen[bytes]:
        if (earlier := self.procs.get(name)) is not None and earlier.poll() is None:
            raise RuntimeError(f"{name} is still running: stop it before starting it again")
        with open(self.workdir / f"{name}.log", "ab") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen(
                [*command, *args], cwd=self.workdir, env={**self.env, **(extra_env or {})}, stdout=log, stderr=log
            )
        self.procs[name] = proc
        return proc

    def kill9(self, name: str) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop_all(self, timeout_s: float = 20) -> dict[str, int | None]:
        """Stop every process; called from a `finally` while a test is failing, it prints their logs
        first (pytest shows a failed test's output), so a failure seen only in CI can be read."""
        if sys.exc_info()[0] is not None:
            print(self.logs())
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        deadline = time.monotonic() + timeout_s
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)  # reaped here, or its Popen warns "still running" in a later test
                codes[name] = None
        return codes

    def children(self, name: str) -> list[int]:
        """The pids of the process's own child processes (Linux)."""
        pid = self.procs[name].pid
        found: list[int] = []
        for task in Path(f"/proc/{pid}/task").glob("*"):  # each thread lists the children it forked
            try:
                found += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
        return found

    def descendants(self, name: str) -> list[int]:
        """The pids of the process's children, their children, and so on (Linux)."""
        found: list[int] = []
        todo = [self.procs[name].pid]
        while todo:
            pid = todo.pop()
            for task in Path(f"/proc/{pid}/task").glob("*"):
                try:
                    kids = [int(c) for c in (task / "children").read_text().split()]
                except OSError:
                    continue
                found += kids
                todo += kids
        return found

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        parts = []
        for name in self.procs:
            path = self.workdir / f"{name}.log"
            text = path.read_text(errors="replace") if path.exists() else ""
            parts.append(f"===== {name} =====\n{text[-12000:]}")
        return "\n".join(parts)


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def alive(pid: int) -> bool:
    """Whether `pid` is a running process (a zombie waiting to be reaped counts as gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"
