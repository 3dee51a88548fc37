"""Which scanner claims which bucket of the Redis time index.

`RedisTimeIndex(..., scanner_id=...)`, or `index.for_scanner(id)`, claims only the buckets it owns.
Each scanner heartbeats into `<prefix>:scanners`, and a bucket belongs to the live scanner with
the highest rendezvous hash of (scanner, bucket). When a scanner stops heartbeating, its buckets
pass to the others within `membership_ttl_s`. While views differ, two scanners may both claim a
bucket: the Lua claim and the confirmation still return each run at most once, and the store's
conditional claim decides the rest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from jobq.errors import ConfigError
from jobq.timeindex.redis_door import Door, as_text


class ScannerMembership:
    """The live scanners, and which buckets each one owns.

    Each scanner heartbeats into one sorted set (member: scanner id, score: last heartbeat ms).
    A scanner is live while its heartbeat is younger than `ttl_ms`; members silent for ten TTLs
    are deleted. A bucket belongs to the live scanner with the highest rendezvous hash of
    (scanner id, bucket), so when a scanner joins or leaves only the buckets it gains or loses
    move. Views refresh with each heartbeat; while two scanners' views differ a bucket may be
    claimed by both, which is harmless (claims are atomic), or briefly by neither."""

    def __init__(self, door: Door, key: str, scanner_id: str, ttl_ms: int) -> None:
        if ttl_ms <= 0:
            raise ConfigError("membership_ttl_s", ttl_ms / 1000, "must be positive")
        self._door = door
        self.key = key
        self.scanner_id = scanner_id
        self.ttl_ms = ttl_ms
        self._live: tuple[str, ...] = (scanner_id,)
        self._beat_ms: int | None = None

    @property
    def live(self) -> tuple[str, ...]:
        """The live scanners as of the last heartbeat (just this one before the first)."""
        return self._live

    def heartbeat(self, now_ms: int) -> tuple[str, ...]:
        """Record this scanner as alive at `now_ms` and reload the live set (one round trip)."""
        (replies,) = self._door.run(
            [
                ("ZADD", self.key, now_ms, self.scanner_id),
                ("ZREMRANGEBYSCORE", self.key, "-inf", f"({now_ms - 10 * self.ttl_ms}"),
                ("PEXPIRE", self.key, 10 * self.ttl_ms),
                ("ZRANGEBYSCORE", self.key, f"({now_ms - self.ttl_ms}", "+inf"),
            ]
        )
        live = {as_text(m) for m in replies[3]} | {self.scanner_id}
        self._live = tuple(sorted(live))
        self._beat_ms = now_ms
        return self._live

    def refresh(self, now_ms: int) -> None:
        """Heartbeat when a third of the TTL has passed since the last one (or time went back)."""
        if self._beat_ms is None or not 0 <= now_ms - self._beat_ms < self.ttl_ms // 3:
            self.heartbeat(now_ms)

    def owner(self, bucket: str) -> str:
        return max(self._live, key=lambda scanner: (_rendezvous(scanner, bucket), scanner))

    def owns(self, bucket: str) -> bool:
        return len(self._live) == 1 or self.owner(bucket) == self.scanner_id

    def owned_buckets(self, buckets: Iterable[str]) -> list[str]:
        return [b for b in buckets if self.owns(b)]

    def leave(self) -> None:
        """Drop out of the live set now, so the others take over without waiting for the TTL."""
        self._door.run([("ZREM", self.key, self.scanner_id)])


def _rendezvous(scanner_id: str, bucket: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{scanner_id}\0{bucket}".encode(), digest_size=8).digest())
