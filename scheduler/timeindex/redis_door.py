"""The Redis time index's only door to redis-py: ordered batches of commands, Lua script calls
that survive a script cache flush, and redis errors translated into jobq's.

Standalone, every phase of a batch shares one pipeline (one round trip, in order); on Redis
Cluster, where a pipeline has no order across nodes, each phase is its own round trip. The Lua
scripts (`claim.lua`, `confirm.lua`) sit beside this module; their headers document keys and
arguments.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from jobq.errors import StoreError, StoreUnavailable
from jobq.extras import require

log = logging.getLogger("jobq.timeindex.redis")

Command = tuple[Any, ...]


def as_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def with_scores(reply: list[Any]) -> list[Any]:
    """(member, score) pairs from a WITHSCORES reply, whether redis-py paired it or not."""
    if reply and not isinstance(reply[0], list | tuple):
        return list(zip(reply[::2], reply[1::2], strict=True))
    return reply


class RedisClient(Protocol):
    """What the index needs of a client: `redis.Redis`, `redis.RedisCluster` or a fakeredis double."""

    def pipeline(self, transaction: bool = ...) -> Any: ...

    def script_load(self, script: str) -> Any: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Script:
    source: str
    sha: str

    @classmethod
    def load(cls, name: str) -> Script:
        source = importlib.resources.files("jobq.timeindex").joinpath(name).read_text(encoding="utf-8")
        return cls(source, hashlib.sha1(source.encode()).hexdigest())


CLAIM = Script.load("claim.lua")
CONFIRM = Script.load("confirm.lua")


class Door:
    """The only place redis-py is called: ordered batches, script calls that survive a script
    cache flush, and redis errors translated into jobq's."""

    def __init__(self, client: RedisClient) -> None:
        redis = require("redis", "redis", "the Redis time index")
        self.client = client
        self.cluster = isinstance(client, redis.RedisCluster)
        self._errors: Any = redis.exceptions
        self._caught: tuple[type[BaseException], ...] = (
            redis.exceptions.RedisError,
            redis.exceptions.RedisClusterException,
        )
        self._lock = threading.Lock()
        self.round_trips = 0

    def run(self, *phases: Sequence[Command]) -> list[list[Any]]:
        """Execute the phases in order and return each phase's replies.

        Standalone, all phases share one pipeline: one round trip, in order. On a cluster a
        pipeline is split by node with no order between nodes, so each phase is its own round trip.
        Raises `StoreUnavailable` (retryable) or `StoreError`."""
        groups = [[c for phase in phases for c in phase]] if not self.cluster else [list(p) for p in phases]
        replies: list[Any] = []
        try:
            for group in groups:
                replies.extend(self._pipeline(group) if group else [])
        except self._caught as exc:
            raise self._translate(exc) from exc
        out: list[list[Any]] = []
        start = 0
        for phase in phases:
            out.append(replies[start : start + len(phase)])
            start += len(phase)
        return out

    def _pipeline(self, commands: list[Command]) -> list[Any]:
        replies = self._execute(commands)
        missing = [i for i, r in enumerate(replies) if isinstance(r, self._errors.NoScriptError)]
        if missing:  # a restart, SCRIPT FLUSH or failover emptied the script cache: load and redo those
            for script in (CLAIM, CONFIRM):
                self.client.script_load(script.source)  # to every primary, on a cluster
            for i, reply in zip(missing, self._execute([commands[i] for i in missing]), strict=True):
                replies[i] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def _execute(self, commands: list[Command]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        with self._lock:
            self.round_trips += 1
        replies: list[Any] = pipe.execute(raise_on_error=False)
        return replies

    def _translate(self, exc: BaseException) -> StoreError:
        e = self._errors
        down = (
            e.ConnectionError,
            e.TimeoutError,
            e.BusyLoadingError,
            e.ReadOnlyError,
            e.ClusterDownError,
            e.TryAgainError,
            e.MasterDownError,
        )
        if isinstance(exc, down):
            return StoreUnavailable(f"time index: Redis unavailable: {exc}")
        return StoreError(f"time index: Redis refused a command: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        try:
            self.client.close()
        except self._caught as exc:
            log.debug("closing the Redis client failed: %s", exc)
