"""The tasks the pool contract runs, in two flavours with the same names and behaviour: plain
functions (prefork, threads, gevent, solo) and `async def` (asyncio, whose hard limit can stop
only a coroutine). They talk to the test through files, which reach a prefork child as well."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

from jobq.app import App
from jobq.errors import Fail, Retry, SoftTimeLimitExceeded
from jobq.tasks import TaskContext

HARD_LIMIT_S = 1.0


def nap(seconds: float = 0.02) -> None:
    """Sleep so that every pool can interrupt it: on the gevent pool (unpatched, its hub on a
    thread of its own) only a gevent sleep lets other greenlets, and the pool's kill, in."""
    if threading.current_thread().name == "jobq-gevent-hub":
        import gevent

        gevent.sleep(seconds)
    else:
        time.sleep(seconds)


def touch(path: str, text: str = "") -> None:
    Path(path).write_text(text)


def register(app: App, pool: str) -> None:
    if pool == "asyncio":
        _register_async(app)
    else:
        _register_sync(app, pool)


def _register_sync(app: App, pool: str) -> None:
    @app.task(name="c.add")
    def add(a: int, b: int) -> dict[str, Any]:
        return {"sum": a + b, "pid": os.getpid()}

    @app.task(name="c.flaky")
    def flaky(marker: str) -> str:
        if not os.path.exists(marker):
            touch(marker)
            raise Retry("first try fails", delay_s=0)
        return "second try"

    @app.task(name="c.fail")
    def fail() -> None:
        raise Fail("no good")

    @app.task(name="c.hold", bind=True)
    def hold(ctx: TaskContext, started: str, release: str) -> str:
        touch(started)
        while not os.path.exists(release):
            if ctx.lease_lost:
                touch(started + ".lost", "cancelled" if ctx.cancelled else "lost")
                return "saw the lease lost"
            nap()
        return "released"

    @app.task(name="c.soft")
    def soft(started: str) -> str:
        try:  # the limit may fire as soon as the test sees the file: catch it from the first line
            touch(started)
            while True:
                nap()
        except SoftTimeLimitExceeded:
            return "cleaned up"

    @app.task(name="c.forever", timeout_s=HARD_LIMIT_S)
    def forever(started: str) -> None:
        touch(started)
        while True:
            nap()

    @app.task(name="c.crash")
    def crash() -> None:
        if pool == "prefork":
            os._exit(3)  # the child dies mid-task
        raise SystemExit(3)  # the closest a task gets to killing an in-process pool


def _register_async(app: App) -> None:
    @app.task(name="c.add")
    async def add(a: int, b: int) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"sum": a + b, "pid": os.getpid()}

    @app.task(name="c.flaky")
    async def flaky(marker: str) -> str:
        if not os.path.exists(marker):
            touch(marker)
            raise Retry("first try fails", delay_s=0)
        return "second try"

    @app.task(name="c.fail")
    async def fail() -> None:
        raise Fail("no good")

    @app.task(name="c.hold", bind=True)
    async def hold(ctx: TaskContext, started: str, release: str) -> str:
        touch(started)
        while not os.path.exists(release):
            if ctx.lease_lost:
                touch(started + ".lost", "cancelled" if ctx.cancelled else "lost")
                return "saw the lease lost"
            await asyncio.sleep(0.02)
        return "released"

    @app.task(name="c.soft")
    async def soft(started: str) -> str:
        try:
            touch(started)
            while True:
                await asyncio.sleep(0.02)
        except SoftTimeLimitExceeded:
            return "cleaned up"

    @app.task(name="c.forever", timeout_s=HARD_LIMIT_S)
    async def forever(started: str) -> None:
        touch(started)
        while True:
            await asyncio.sleep(0.02)

    @app.task(name="c.crash")
    async def crash() -> None:
        raise SystemExit(3)
