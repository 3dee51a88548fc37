"""The Redis time index: per-minute, per-priority sorted-set buckets, claimed by one-key Lua scripts.

URLs (`RedisTimeIndex.from_url`)::

    redis://[user:password@]host:6379/0?prefix=jobq&capacity=1000000
    rediss://...                        TLS; redis-py's `ssl_*` query options pass through
    redis://host:7000?cluster=true      Redis Cluster (also `rediss://...?cluster=true`); no db number

`prefix` (default `jobq`) starts every key; `capacity` (default 1,000,000) is the number of runs
the index is sized for (see the id directory below). Other query options go to redis-py.

Keys (P = priority, M = UTC minute of the due time as YYYYMMDDHHMM)::

    <prefix>:schedule:<P>:<M>:<sub>   sorted set, a bucket: member = compact run id, score = due time
    <prefix>:buckets:<P>              sorted set, the bucket directory: member "<M>:<sub>", score = a
                                      lower bound of the bucket's earliest due ms
    <prefix>:ids:<n>                  hash, a shard of the id directory: field = 63-bit hash of a run
                                      id, value = 31-bit tag of the run's one live copy (bucket + score)
    <prefix>:meta                     hash: `id_shards`, fixed by the first index that runs
    <prefix>:scanners                 sorted set: scanner id -> last heartbeat ms

A bucket expires 4 hours after its minute ends, and never less than 4 hours from now, so that a
run re-indexed long after its due time (beat's repair) is not dropped on arrival.

Memory: the capacity plan budgets 64 B per indexed run. A sorted set with more than 128 members
is a skiplist, at about 140 B per member whatever the member. Up to 128 members it is a listpack,
where a member costs its own bytes plus about 3. Hence:

* Sub-buckets. A minute is split into sub-buckets of at most `FILL` (100) runs. Each index object
  fills its own (`<sub>` = a random tag of the object + a counter), so adders need no coordination,
  and a spike at the top of the hour only makes more buckets, never a skiplist.
* Compact members and small scores: 22 bytes for a `jobq.ids` run id, and scores within a 16-bit
  integer (`jobq.timeindex.redis_codec`).

Measured on Redis 7.0 at 1,000,000 runs (`benchmarks/redis_index.py`): 53 B per run by `INFO
memory` (52 B by `MEMORY USAGE`), every bucket and id-directory shard a listpack, 98 runs per
bucket. The plain design (full run id, one sorted set per tier and minute) measured 151 B.

Exact semantics. Re-adding a run may put it in another bucket, and `discard` is given ids only.
So each run has an entry in the id directory naming its one live copy: `add` overwrites it,
`discard` deletes it, and a claim keeps a copy only if the directory still names it
(`confirm.lua`, which deletes the entry too). Stale copies are dropped when claimed, or when their
bucket expires. The directory costs about 20 B per run, in `id_shards` small hashes (a power of
two near `capacity / 64`). Past about twice the capacity, shards outgrow the listpack and memory
per run rises. The first index to run stores `id_shards` in `<prefix>:meta`, and later ones use
the stored value, since changing it would orphan every entry.

Claims. `claim_due` reads each tier's bucket directory: one round trip for all four, and
nothing more when nothing is due, whatever the backlog. It then takes due runs bucket by bucket,
lowest bound first, with `claim.lua` (one key per call, so it runs on Redis Cluster), confirms
them against the id directory, and moves each bucket's bound to its new head. That is four round
trips for a full batch. CRITICAL is drained before HIGH, DEFAULT and LOW. Within a tier, runs
come by due time inside a bucket, and buckets come by their earliest due time. Two sub-buckets
of one minute interleave, so between them the order is by minute, not by millisecond. The
confirmation is one small script per directory shard touched (about one per claimed run), and it
costs most of a claim. Measured: `claim_due` moves about 30,000 runs/s at 1,000 per call, and the
claim script alone about 600,000.

The bucket directory is kept without multi-key atomicity. An adder writes the id directory, then
the bucket, then lowers the bucket's bound (`ZADD LT`). A claimer raises the bound (`ZADD XX
GT`) or removes it, then re-reads the bucket's head, and lowers the bound again if an add slipped
in. In every interleaving the bound ends at or below every live member, so no run is stranded.
On a cluster, where a pipeline has no order across nodes, each of those steps is its own round
trip.

Scanners. `RedisTimeIndex(..., scanner_id=...)`, or `index.for_scanner(id)`, claims only the
buckets it owns (`jobq.timeindex.redis_scanners`). Every redis-py call goes through one door
(`jobq.timeindex.redis_door`), which translates redis errors into `StoreUnavailable`/`StoreError`.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from jobq.clock import SYSTEM_CLOCK, Clock
from jobq.errors import ConfigError, StoreError, StoreUnavailable
from jobq.extras import require
from jobq.models import PRIORITIES_BY_RANK, Priority
from jobq.ports import IndexEntry
from jobq.timeindex.redis_codec import (
    BIAS_MS,
    CROCKFORD,
    MINUTE_MS,
    base_ms,
    copy_tag,
    decode_member,
    encode_member,
    id_hash,
    label_minute,
    minute_label,
)
from jobq.timeindex.redis_door import CLAIM, CONFIRM, Command, Door, RedisClient, as_text, with_scores
from jobq.timeindex.redis_scanners import ScannerMembership

__all__ = [
    "CLAIM",
    "CONFIRM",
    "DEFAULT_CAPACITY",
    "FILL",
    "RedisTimeIndex",
    "ScannerMembership",
    "decode_member",
    "encode_member",
]

log = logging.getLogger("jobq.timeindex.redis")

FILL = 100  # members per bucket: under zset-max-listpack-entries (128 by default), so buckets stay listpacks
DEFAULT_CAPACITY = 1_000_000
BUCKET_TTL_S = 4 * 3600
_MAX_DUE_MS = 253_402_300_800_000  # 10000-01-01: the YYYYMMDDHHMM key has four year digits
_WINDOW = 256  # directory entries read per tier per query when scanners share the buckets
_PEEK_BUCKETS = 4  # next_due_ms looks at the heads of this many buckets...
_PEEK_MEMBERS = 8  # ...and this many members of each, then settles for a lower bound
_MAX_ROUNDS = 64  # claim rounds per call; a full batch makes the scanner call again at once


def _id_shards_for(capacity: int) -> int:
    """A power of two near capacity / 64: shards then average ~60 fields, well inside a listpack."""
    return 1 << max(0, (capacity - 1) // 64).bit_length()


@dataclass(slots=True)
class _Copy:
    run_id: str
    field: int
    tag: int


class RedisTimeIndex:
    """A `TimeIndex` in Redis or Redis Cluster; see the module docstring for the layout.

    Thread-safe: one object may serve a scanner's threads and its re-adds at once."""

    derived_from_store = False

    def __init__(
        self,
        client: RedisClient,
        *,
        prefix: str = "jobq",
        capacity: int = DEFAULT_CAPACITY,
        scanner_id: str | None = None,
        membership_ttl_s: float = 15.0,
        clock: Clock = SYSTEM_CLOCK,
        owns_client: bool = False,
    ) -> None:
        """`clock` only sets key expiry (Redis expires keys by its own wall clock); claims use the
        `now_ms` they are given. With `owns_client`, `close` closes the client too."""
        if not prefix or any(c.isspace() for c in prefix):
            raise ConfigError("index.prefix", prefix, "must be non-empty, without spaces")
        if capacity < 1:
            raise ConfigError("index.capacity", capacity, "must be a positive number of runs")
        self.prefix = prefix
        self.capacity = capacity
        self.clock = clock
        self._door = Door(client)
        self._owns_client = owns_client
        self._membership_ttl_s = membership_ttl_s
        self.membership = (
            ScannerMembership(self._door, f"{prefix}:scanners", scanner_id, round(membership_ttl_s * 1000))
            if scanner_id
            else None
        )
        self._id_shards: int | None = None
        self._lock = threading.Lock()
        self._tag = "".join(secrets.choice(CROCKFORD) for _ in range(5))  # this object's sub-buckets
        self._seq = itertools.count()
        self._fills: dict[tuple[int, int], list[int]] = {}  # (rank, minute) -> [sub number, members added]
        # Buckets whose directory bound next_due_ms found to be the due time of a live run. Trusted
        # while the bound stays put: a later add can only lower it, a claim only raise it. (Another
        # process discarding that run makes next_due_ms early, never late.)
        self._checked: dict[tuple[Priority, str], int] = {}

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        scanner_id: str | None = None,
        membership_ttl_s: float = 15.0,
        clock: Clock = SYSTEM_CLOCK,
        **client_options: Any,
    ) -> RedisTimeIndex:
        """Connect from `redis://`, `rediss://` (TLS) or either with `?cluster=true`.

        Raises `MissingExtra` without redis-py, `ConfigError` for a bad URL or option, and
        `StoreUnavailable` when a cluster cannot be reached (a standalone client connects lazily)."""
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss"):
            raise ConfigError("index", url, "a Redis index URL starts with redis:// or rediss://")
        ours = {"prefix", "capacity", "cluster"}
        forced = {"decode_responses", "protocol"}  # members are bytes; replies are parsed as RESP2
        query = parse_qsl(parts.query, keep_blank_values=True)
        options = {k: v for k, v in query if k in ours}
        rest = [(k, v) for k, v in query if k not in ours | forced]
        client_url = urlunsplit(parts._replace(query=urlencode(rest)))
        prefix = options.get("prefix", "jobq")
        try:
            capacity = int(options.get("capacity", DEFAULT_CAPACITY))
        except ValueError:
            raise ConfigError("index.capacity", options["capacity"], "must be a whole number of runs") from None
        cluster_flag = options.get("cluster", "false").lower()
        if cluster_flag not in ("true", "false", "1", "0", "yes", "no"):
            raise ConfigError("index.cluster", options["cluster"], "use cluster=true or cluster=false")
        redis = require("redis", "redis", "the Redis time index")
        kwargs = {**client_options, "decode_responses": False, "protocol": 2}
        try:
            if cluster_flag in ("true", "1", "yes"):
                client = redis.RedisCluster.from_url(client_url, **kwargs)
            else:
                client = redis.Redis.from_url(client_url, **kwargs)
        except ValueError as exc:
            raise ConfigError("index", url, str(exc)) from None
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
            raise StoreUnavailable(f"time index: cannot reach Redis at {parts.hostname}:{parts.port}: {exc}") from exc
        return cls(
            client,
            prefix=prefix,
            capacity=capacity,
            scanner_id=scanner_id,
            membership_ttl_s=membership_ttl_s,
            clock=clock,
            owns_client=True,
        )

    def for_scanner(self, scanner_id: str) -> RedisTimeIndex:
        """A view of the same index, on the same client, that claims only `scanner_id`'s buckets."""
        return RedisTimeIndex(
            self._door.client,
            prefix=self.prefix,
            capacity=self.capacity,
            scanner_id=scanner_id,
            membership_ttl_s=self._membership_ttl_s,
            clock=self.clock,
        )

    @property
    def round_trips(self) -> int:
        """Round trips to Redis made so far by this object (diagnostics, tests, benchmarks)."""
        return self._door.round_trips

    # -- keys ---------------------------------------------------------------------------------------

    def bucket_key(self, priority: Priority | str, suffix: str) -> str:
        return f"{self.prefix}:schedule:{Priority(priority).value}:{suffix}"

    def _directory(self, priority: Priority) -> str:
        return f"{self.prefix}:buckets:{priority.value}"

    def _ids_key(self, field: int) -> str:
        return f"{self.prefix}:ids:{field % self._shards()}"

    def _shards(self) -> int:
        if self._id_shards is None:
            wanted = _id_shards_for(self.capacity)
            meta = f"{self.prefix}:meta"
            (replies,) = self._door.run([("HSETNX", meta, "id_shards", wanted), ("HGET", meta, "id_shards")])
            stored = int(replies[1])
            if stored != wanted:
                log.warning(
                    "the index under %r keeps its %d id shards (capacity=%d asks for %d)",
                    self.prefix,
                    stored,
                    self.capacity,
                    wanted,
                )
            self._id_shards = stored
        return self._id_shards

    def _sub(self, rank: int, minute: int) -> str:
        """The sub-bucket the next run of (tier, minute) goes to; the caller holds the lock."""
        fill = self._fills.get((rank, minute))
        if fill is None or fill[1] >= FILL:
            if len(self._fills) >= 8192:
                self._fills.clear()  # forgetting only opens fresh sub-buckets early
            fill = self._fills[(rank, minute)] = [next(self._seq), 0]
        fill[1] += 1
        return f"{self._tag}.{fill[0]}"

    # -- TimeIndex ----------------------------------------------------------------------------------

    def add(self, entries: Sequence[IndexEntry]) -> None:
        """Index the runs at their due time, in one round trip (three on a cluster).

        Idempotent: adding a run again moves it (its earlier copy, if any, is no longer claimable).
        Raises `ValueError` for a due time outside years 1970-9999 (before anything is written),
        and `StoreUnavailable` / `StoreError` from Redis."""
        if not entries:
            return
        for e in entries:
            if not 0 <= e.due_ms < _MAX_DUE_MS:
                raise ValueError(f"due_ms={e.due_ms} of {e.run_id!r} is outside the years 1970-9999")
        self._checked.clear()
        shards = self._shards()
        expire_floor_s = self.clock.now_ms() // 1000 + BUCKET_TTL_S
        pointers: dict[str, dict[int, int]] = defaultdict(dict)
        buckets: dict[tuple[Priority, str], dict[bytes, int]] = defaultdict(dict)
        heads: dict[tuple[Priority, str], int] = {}
        with self._lock:
            for e in entries:
                minute = e.due_ms // MINUTE_MS
                suffix = f"{minute_label(minute)}:{self._sub(e.priority.rank, minute)}"
                score = e.due_ms - minute * MINUTE_MS - BIAS_MS
                field = id_hash(e.run_id)
                pointers[f"{self.prefix}:ids:{field % shards}"][field] = copy_tag(e.priority.value, suffix, score)
                buckets[(e.priority, suffix)][encode_member(e.run_id)] = score
                heads[(e.priority, suffix)] = min(e.due_ms, heads.get((e.priority, suffix), e.due_ms))
        # The directory entry first, then the copy, then the bound: a claimer never meets a copy
        # that the directory does not name yet, nor a bucket that its bound does not cover.
        directory: list[Command] = [
            ("HSET", key, *itertools.chain.from_iterable(fields.items())) for key, fields in pointers.items()
        ]
        copies: list[Command] = []
        bounds: dict[Priority, list[Any]] = defaultdict(list)
        for (priority, suffix), members in buckets.items():
            key = self.bucket_key(priority, suffix)
            copies.append(("ZADD", key, *itertools.chain.from_iterable((s, m) for m, s in members.items())))
            minute_end_s = (label_minute(suffix[:12]) + 1) * 60
            copies.append(("EXPIREAT", key, max(minute_end_s + BUCKET_TTL_S, expire_floor_s)))
            bounds[priority] += (heads[(priority, suffix)], suffix)
        lowered: list[Command] = [("ZADD", self._directory(p), "LT", *pairs) for p, pairs in bounds.items()]
        self._door.run(directory, copies, lowered)

    def claim_due(self, now_ms: int, limit: int) -> list[str]:
        """Up to `limit` run ids due by `now_ms`, CRITICAL first, then by due time (see the module
        docstring for the order between sub-buckets of one minute); each is removed atomically and
        returned to exactly one caller. With a `scanner_id`, only this scanner's buckets are
        claimed (and its heartbeat is refreshed). Raises `StoreUnavailable` / `StoreError`; a
        failure part-way may lose claimed runs from the index, which beat's repair re-adds."""
        if limit <= 0:
            return []
        owns = self._ownership(now_ms)
        # A window lists a tier's due buckets: twice as many as full buckets would need (most are
        # not full), plus one to tell "that is all of them" from "there are more". Wider when most
        # buckets are other scanners'.
        width = _WINDOW if self.membership else min(_WINDOW, 2 * -(-limit // FILL) + 1)
        windows = dict(zip(PRIORITIES_BY_RANK, self._due_windows(PRIORITIES_BY_RANK, now_ms, {}, width), strict=True))
        skipped = dict.fromkeys(PRIORITIES_BY_RANK, 0)
        pending = list(PRIORITIES_BY_RANK)  # tiers that may still hold due runs, CRITICAL first
        out: list[str] = []
        for _ in range(_MAX_ROUNDS):
            if len(out) >= limit or not pending:
                break
            # Every due bucket of each tier in order, down to the first tier whose window may not
            # list them all: a lower tier never goes before runs still due above it.
            candidates: list[tuple[Priority, str]] = []
            seen: list[Priority] = []
            unfinished: set[Priority] = set()
            for priority in pending:
                window = windows[priority]
                seen.append(priority)
                candidates += [(priority, s) for s in window if owns(priority, s)]
                if len(window) == width:
                    skipped[priority] += sum(1 for s in window if not owns(priority, s))
                    unfinished.add(priority)
                    break
            plan = self._plan(candidates, now_ms, limit - len(out))
            planned = {(p, s) for p, s, _, _ in plan}
            unfinished |= {p for p, _, _, whole in plan if not whole}
            unfinished |= {p for p, s in candidates if (p, s) not in planned}
            if plan:
                got, still_due = self._claim_round(plan, now_ms)
                out += got
                unfinished |= still_due
            pending = [p for p in pending if p not in seen or p in unfinished]
            again = [p for p in pending if p in unfinished]
            if again and len(out) < limit:
                windows.update(zip(again, self._due_windows(again, now_ms, skipped, width), strict=True))
        return out

    def discard(self, run_ids: Sequence[str]) -> None:
        """Remove the runs (one round trip); absent ids are ignored. A discarded run's copy stays
        in its bucket until claimed or expired, but no claim returns it any more."""
        if not run_ids:
            return
        self._checked.clear()
        by_shard: dict[str, list[int]] = defaultdict(list)
        for run_id in run_ids:
            field = id_hash(run_id)
            by_shard[self._ids_key(field)].append(field)
        self._door.run([("HDEL", key, *fields) for key, fields in by_shard.items()])

    def next_due_ms(self) -> int | None:
        """The earliest due time among claimable runs (of this scanner's buckets, with a
        `scanner_id`), or None; never later than the truth. However large the index: one round
        trip when the earliest bucket's bound is a live run this object found before, else three
        (read the heads of the first buckets, check them against the id directory).

        Early (costing the scanner one empty claim) in two cases: the first members of the
        earliest buckets are all stale copies, and the last one looked at is the answer; or
        another process discarded or moved the run at a head this object checked."""
        owns = self._ownership(None)
        width = _WINDOW if self.membership else _PEEK_BUCKETS + 1
        (windows,) = self._door.run(
            [("ZRANGE", self._directory(p), 0, width - 1, "WITHSCORES") for p in PRIORITIES_BY_RANK]
        )
        offers: list[int] = []  # due times, or lower bounds of them; the answer is the least
        candidates: list[tuple[int, Priority, str]] = []
        for priority, window in zip(PRIORITIES_BY_RANK, windows, strict=True):
            listed = [(int(bound), as_text(suffix)) for suffix, bound in with_scores(window)]
            if len(listed) == width:
                offers.append(listed[-1][0])  # buckets past the window have bounds at least this
            candidates += [(bound, priority, suffix) for bound, suffix in listed if owns(priority, suffix)]
        candidates.sort()
        if candidates and self._checked.get(candidates[0][1:]) == candidates[0][0]:
            return min([candidates[0][0], *offers])  # a live run sits at the lowest bound
        peeked = candidates[:_PEEK_BUCKETS]
        offers += [bound for bound, _, _ in candidates[_PEEK_BUCKETS : _PEEK_BUCKETS + 1]]
        if not peeked:
            return min(offers, default=None)
        (heads,) = self._door.run(
            [("ZRANGE", self.bucket_key(p, s), 0, _PEEK_MEMBERS - 1, "WITHSCORES") for _, p, s in peeked]
        )
        shown: list[tuple[int, _Copy, int]] = []  # peeked bucket, copy, due ms
        for i, ((_, priority, suffix), members) in enumerate(zip(peeked, heads, strict=True)):
            base = base_ms(suffix)
            for member, score in with_scores(members):
                run_id = decode_member(member)
                tag = copy_tag(priority.value, suffix, int(score))
                shown.append((i, _Copy(run_id, id_hash(run_id), tag), base + int(score)))
        (tags,) = self._door.run([("HGET", self._ids_key(c.field), c.field) for _, c, _ in shown])
        live: dict[int, int] = {}  # peeked bucket -> due ms of its first live member
        for (i, copy, due_ms), tag in zip(shown, tags, strict=True):
            if i not in live and tag is not None and int(tag) == copy.tag:
                live[i] = due_ms
        if len(self._checked) > 4096:
            self._checked.clear()
        for i, ((bound, priority, suffix), members) in enumerate(zip(peeked, heads, strict=True)):
            if i in live:
                offers.append(live[i])
                if live[i] == bound:
                    self._checked[(priority, suffix)] = bound
            elif len(members) == _PEEK_MEMBERS:
                offers.append(max(due for j, _, due in shown if j == i))  # unseen members come later
        return min(offers, default=None)

    def close(self) -> None:
        """Leave the scanner set (so others take over at once) and close an owned client."""
        if self.membership is not None:
            try:
                self.membership.leave()
            except StoreError as exc:
                log.warning("could not leave the scanner set: %s", exc)
        if self._owns_client:
            self._door.close()

    # -- claiming -----------------------------------------------------------------------------------

    def _ownership(self, now_ms: int | None) -> Callable[[Priority, str], bool]:
        membership = self.membership
        if membership is None:
            return lambda priority, suffix: True
        if now_ms is not None:
            membership.refresh(now_ms)
        return lambda priority, suffix: membership.owns(f"{priority.value}:{suffix}")

    def _due_windows(
        self, priorities: Sequence[Priority], now_ms: int, skip: dict[Priority, int], width: int
    ) -> list[list[str]]:
        """Per tier, the bucket suffixes whose directory bound is due, lowest bound first."""
        (replies,) = self._door.run(
            [("ZRANGEBYSCORE", self._directory(p), "-inf", now_ms, "LIMIT", skip.get(p, 0), width) for p in priorities]
        )
        return [[as_text(s) for s in reply] for reply in replies]

    def _plan(
        self, candidates: list[tuple[Priority, str]], now_ms: int, budget: int
    ) -> list[tuple[Priority, str, int, bool]]:
        """How many runs to take from each candidate bucket, in order, at most `budget` in all:
        (tier, bucket, take, whether that is all it holds due). When a full bucket's worth for
        each fits the budget, no counting; otherwise one ZCOUNT round trip sizes the takes."""
        if len(candidates) * FILL <= budget:
            return [(p, s, FILL, True) for p, s in candidates]
        (counts,) = self._door.run(
            [("ZCOUNT", self.bucket_key(p, s), "-inf", now_ms - base_ms(s)) for p, s in candidates]
        )
        plan: list[tuple[Priority, str, int, bool]] = []
        for (priority, suffix), count in zip(candidates, counts, strict=True):
            if budget <= 0:
                break
            take = min(int(count), budget)  # a bucket with none due is still visited: its bound moves up
            plan.append((priority, suffix, take, take == int(count)))
            budget -= take
        return plan

    def _claim_round(self, plan: list[tuple[Priority, str, int, bool]], now_ms: int) -> tuple[list[str], set[Priority]]:
        """Claim from the planned buckets: two round trips (three on a cluster; one more when an
        add raced the directory). Returns the confirmed ids, in plan order, and the tiers of
        visited buckets that still hold due runs."""
        claims: list[Command] = []
        bases: list[int] = []
        for priority, suffix, take, _ in plan:
            base = base_ms(suffix)
            bases.append(base)
            claims.append(("EVALSHA", CLAIM.sha, 1, self.bucket_key(priority, suffix), now_ms - base, take))
        (taken,) = self._door.run(claims)
        copies: list[_Copy] = []
        moves: list[Command] = []
        rereads: list[Command] = []
        raised: list[int | None] = []
        still_due: set[Priority] = set()
        for (priority, suffix, _, _), base, (pairs, head) in zip(plan, bases, taken, strict=True):
            for i in range(0, len(pairs), 2):
                score = int(float(pairs[i + 1]))
                run_id = decode_member(pairs[i])
                copies.append(_Copy(run_id, id_hash(run_id), copy_tag(priority.value, suffix, score)))
            directory = self._directory(priority)
            if head is None:
                raised.append(None)
                moves.append(("ZREM", directory, suffix))
            else:
                head_ms = base + int(float(head))
                raised.append(head_ms)
                moves.append(("ZADD", directory, "XX", "GT", head_ms, suffix))
                if head_ms <= now_ms:
                    still_due.add(priority)
            rereads.append(("ZRANGE", self.bucket_key(priority, suffix), 0, 0, "WITHSCORES"))
        confirms, slots = self._confirmations(copies)
        replies, heads = self._door.run([*confirms, *moves], rereads)
        # An add that landed between the claim and the raise may have put a run below the new
        # bound: lower the bound to the head read after raising it.
        lowered: list[Command] = []
        for (priority, suffix, _, _), base, raised_ms, head_now in zip(plan, bases, raised, heads, strict=True):
            if head_now:
                head_ms = base + int(with_scores(head_now)[0][1])
                if raised_ms is None or head_ms < raised_ms:
                    lowered.append(("ZADD", self._directory(priority), "LT", head_ms, suffix))
        if lowered:
            self._door.run(lowered)
        keep = [bool(replies[cmd][pos]) for cmd, pos in slots]
        return [c.run_id for c, ok in zip(copies, keep, strict=True) if ok], still_due

    def _confirmations(self, copies: list[_Copy]) -> tuple[list[Command], list[tuple[int, int]]]:
        """One `confirm.lua` call per directory shard, and where each copy's answer will be."""
        by_key: dict[str, list[int]] = defaultdict(list)
        for i, copy in enumerate(copies):
            by_key[self._ids_key(copy.field)].append(i)
        commands: list[Command] = []
        slots: list[tuple[int, int]] = [(0, 0)] * len(copies)
        for key, members in by_key.items():
            args: list[int] = []
            for pos, i in enumerate(members):
                args += (copies[i].field, copies[i].tag)
                slots[i] = (len(commands), pos)
            commands.append(("EVALSHA", CONFIRM.sha, 1, key, *args))
        return commands, slots
