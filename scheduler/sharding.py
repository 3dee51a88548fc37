"""Which beat materialises which jobs: jobs fall into `JOB_SHARDS` shards, beats share them out.

A store places each job in a shard in 0..15 (`job_shard` in the SQLite, in-memory and DynamoDB
stores; PostgreSQL computes its own hash in SQL); `JobStore.due_jobs(..., shards=...)` returns
only jobs of the given shards. Each beat reads the live beats from the daemon registry and owns
the shards for which it has the highest rendezvous hash of (beat id, shard), as scanners own
Redis buckets (`jobq.timeindex.redis_scanners`): when a beat joins or leaves, only the shards
it gains or loses move. While two beats' views differ, a shard may be materialised by both,
which is harmless: run ids derive from fire times and a job's advance is a compare-and-set on
its version, so the second beat's write of the same job is refused and creates nothing.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable

JOB_SHARDS = 16  # as many as DynamoDB's GSI2 partitions (`DUE#<shard>`), which are keys and cannot change


def job_shard(job_id: str) -> int:
    """The job's shard in 0..15 (crc32: stable across processes, unlike Python's `hash`)."""
    return zlib.crc32(job_id.encode()) % JOB_SHARDS


def owned_shards(me: str, live: Iterable[str]) -> tuple[int, ...] | None:
    """The shards `me` owns among the beats `live` (with `me` counted live whatever `live` says);
    None when `me` is the only beat, meaning every job, whichever shard it is in."""
    beats = set(live) | {me}
    if len(beats) == 1:
        return None
    return tuple(s for s in range(JOB_SHARDS) if max(beats, key=lambda b: (_rendezvous(b, s), b)) == me)


def _rendezvous(beat_id: str, shard: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{beat_id}\0{shard}".encode(), digest_size=8).digest())
