"""The Redis time index beyond the port's contract: key layout and expiry, the Lua scripts, the
member encoding, scanner ownership, round-trip costs, URLs and errors. The contract itself is in
tests/contract/test_timeindex.py."""

from __future__ import annotations

import random
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from factories import T0
from hypothesis import given
from hypothesis import strategies as st
from services import free_port, have_binary, port_open, require_redis

from jobq.errors import ConfigError, MissingExtra, StoreError, StoreUnavailable
from jobq.ids import new_job_id
from jobq.models import Priority
from jobq.ports import IndexEntry
from jobq.timeindex.redis import (
    CLAIM,
    CONFIRM,
    FILL,
    RedisTimeIndex,
    decode_member,
    encode_member,
)

redis = pytest.importorskip("redis")


def fake_redis() -> Any:
    """A fakeredis server of its own (with Lua), for what must never be done to the shared server."""
    return pytest.importorskip("fakeredis").FakeRedis()


MINUTE = 60_000
HOUR = 60 * MINUTE
C, H, D, L = Priority.CRITICAL, Priority.HIGH, Priority.DEFAULT, Priority.LOW


@pytest.fixture
def client() -> Iterator[Any]:
    r = redis.Redis.from_url(require_redis())
    yield r
    r.close()


@pytest.fixture
def prefix(client: Any) -> Iterator[str]:
    name = f"jobq-test-{uuid.uuid4().hex[:12]}"  # the server is shared: never flush it
    yield name
    keys = list(client.scan_iter(match=f"{name}:*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture
def make_index(client: Any, prefix: str) -> Iterator[Callable[..., RedisTimeIndex]]:
    made: list[RedisTimeIndex] = []

    def make(**options: Any) -> RedisTimeIndex:
        made.append(RedisTimeIndex(client, prefix=prefix, **options))
        return made[-1]

    yield make
    for index in made:
        index.close()


def keys(client: Any, pattern: str) -> list[str]:
    return sorted(k.decode() for k in client.scan_iter(match=pattern, count=1000))


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def members_by_bucket(client: Any, prefix: str) -> dict[str, list[str]]:
    """bucket identity "<PRIORITY>:<YYYYMMDDHHMM>:<sub>" -> the run ids in it."""
    out: dict[str, list[str]] = {}
    for key in keys(client, f"{prefix}:schedule:*"):
        bucket = key.removeprefix(f"{prefix}:schedule:")
        out[bucket] = [decode_member(m) for m in client.zrange(key, 0, -1)]
    return out


# -- layout -------------------------------------------------------------------------------------------


class TestLayout:
    def test_a_bucket_key_names_the_priority_and_the_utc_minute_of_the_due_time(
        self, client: Any, prefix: str, make_index: Callable[..., RedisTimeIndex]
    ) -> None:
        due = int(datetime(2026, 12, 24, 18, 30, 59, 999_000, tzinfo=UTC).timestamp() * 1000)
        make_index().add([IndexEntry("job_x:1", due, H)])
        [key] = keys(client, f"{prefix}:schedule:*")
        assert re.fullmatch(rf"{prefix}:schedule:HIGH:202612241830:[0-9a-z]{{5}}\.\d+", key)

    def test_a_bucket_expires_four_hours_after_its_minute_ends(
        self, client: Any, prefix: str, make_index: Callable[..., RedisTimeIndex]
    ) -> None:
        due = wall_ms() + 2 * 24 * HOUR + 12_345
        make_index().add([IndexEntry("job_x:1", due, D)])
        [key] = keys(client, f"{prefix}:schedule:*")
        minute_end_s = (due // MINUTE + 1) * 60
        assert client.expiretime(key) == minute_end_s + 4 * 3600

    def test_a_bucket_of_a_long_past_minute_still_lives_four_hours(
        self, client: Any, prefix: str, make_index: Callable[..., RedisTimeIndex]
    ) -> None:
        make_index().add([IndexEntry("job_x:1", wall_ms() - 30 * 24 * HOUR, D)])  # e.g. re-indexed by repair
        [key] = keys(client, f"{prefix}:schedule:*")
        assert abs(client.ttl(key) - 4 * 3600) <= 5

    def test_a_busy_minute_is_split_into_listpack_buckets_of_at_most_FILL_runs(
        self, client: Any, prefix: str, make_index: Callable[..., RedisTimeIndex]
    ) -> None:
        minute = T0 - T0 % MINUTE
        make_index().add([IndexEntry(f"{new_job_id(T0)}:{T0}", minute + i % MINUTE, C) for i in range(1050)])
        buckets = keys(client, f"{prefix}:schedule:CRITICAL:*")
        assert len(buckets) == 11
        assert all(client.zcard(k) <= FILL for k in buckets)
        assert {client.object("encoding", k) for k in buckets} == {b"listpack"}

    def test_a_compact_member_is_22_bytes_and_its_score_is_the_offset_in_the_minute(
        self, client: Any, prefix: str, make_index: Callable[..., RedisTimeIndex]
    ) -> None:
        run_id = f"{new_job_id(T0)}:{T0}"
        minute = T0 - T0 % MINUTE
        make_index().add([IndexEntry(run_id, minute + 59_999, D)])
        [key] = keys(client, f"{prefix}:schedule:*")
        [(member, score)] = client.zrange(key, 0, -1, withscores=True)
        assert member == encode_member(run_id) and len(member) == 22
        assert score == 59_999 - 30_000  # within ±30 s: a 16-bit integer in the listpack

    def test_the_bucket_directory_holds_each_bucket_under_its_earliest_due_time(
        self, client: Any, prefix: str, make_index: Callable[..., RedisTimeIndex]
    ) -> None:
        make_index().add([IndexEntry("b", T0 + 7, L), IndexEntry("a", T0 + 3, L), IndexEntry("c", T0 + HOUR, L)])
        directory = client.zrange(f"{prefix}:buckets:LOW", 0, -1, withscores=True)
        assert [score for _, score in directory] == [T0 + 3, T0 + HOUR]
        assert {m.decode() for m, _ in directory} == {
            k.removeprefix(f"{prefix}:schedule:LOW:") for k in keys(client, f"{prefix}:schedule:LOW:*")
        }

    def test_the_id_directory_shard_count_is_fixed_by_the_first_index(
        self, client: Any, prefix: str, make_index: Callable[..., RedisTimeIndex]
    ) -> None:
        small = make_index(capacity=1000)
        small.add([IndexEntry(f"r{i}", T0, D) for i in range(50)])
        large = make_index(capacity=10_000_000)
        large.discard([f"r{i}" for i in range(25)])
        assert client.hget(f"{prefix}:meta", "id_shards") == b"16"
        assert sorted(large.claim_due(T0, 100)) == sorted(f"r{i}" for i in range(25, 50))
        assert all(int(k.rsplit(":", 1)[1]) < 16 for k in keys(client, f"{prefix}:ids:*"))


# -- scripts ------------------------------------------------------------------------------------------


class TestScripts:
    @pytest.mark.parametrize("script", [CLAIM, CONFIRM], ids=["claim", "confirm"])
    def test_a_script_only_ever_names_its_one_key(self, script: Any) -> None:
        code = "\n".join(line.split("--")[0] for line in script.source.splitlines())
        assert set(re.findall(r"KEYS\[(\d+)\]", code)) == {"1"}
        calls = re.findall(r"redis\.call\('(\w+)',\s*([^,)]+)", code)
        assert calls and all(target == "KEYS[1]" for _, target in calls)

    def test_the_claim_script_takes_due_members_in_score_order_and_reports_the_next(
        self, client: Any, prefix: str
    ) -> None:
        key = f"{prefix}:schedule:HIGH:202609211413:test.0"
        client.zadd(key, {b"c": 30, b"a": -5, b"b": 10, b"later": 31})
        taken, head = client.eval(CLAIM.source, 1, key, 30, 10)
        assert taken == [b"a", b"-5", b"b", b"10", b"c", b"30"]
        assert head == b"31"
        assert client.zrange(key, 0, -1) == [b"later"]

    def test_the_claim_script_honours_its_limit_and_reports_an_emptied_bucket(self, client: Any, prefix: str) -> None:
        key = f"{prefix}:schedule:LOW:202609211413:test.0"
        client.zadd(key, {b"a": 1, b"b": 2, b"c": 3})
        assert client.eval(CLAIM.source, 1, key, 100, 2) == [[b"a", b"1", b"b", b"2"], b"3"]
        assert client.eval(CLAIM.source, 1, key, 100, 2) == [[b"c", b"3"], None]
        assert client.exists(key) == 0

    def test_the_claim_script_removes_large_batches_in_chunks(self, client: Any, prefix: str) -> None:
        key = f"{prefix}:schedule:LOW:202609211413:big.0"
        client.zadd(key, {f"m{i}".encode(): i for i in range(12_000)})  # more than Lua's unpack limit
        taken, head = client.eval(CLAIM.source, 1, key, 10_499, 11_000)
        assert len(taken) == 2 * 10_500 and head == b"10500"
        assert client.zcard(key) == 1_500

    def test_the_confirm_script_keeps_only_copies_the_directory_names(self, client: Any, prefix: str) -> None:
        key = f"{prefix}:ids:0"
        client.hset(key, mapping={"11": 5, "12": 6})
        assert client.eval(CONFIRM.source, 1, key, "11", "5", "12", "7", "13", "1", "11", "5") == [1, 0, 0, 0]
        assert client.hgetall(key) == {b"12": b"6"}

    def test_each_script_call_of_a_claim_touches_exactly_one_key(
        self, client: Any, prefix: str, make_index: Callable[..., RedisTimeIndex]
    ) -> None:
        index = make_index()
        rng = random.Random(3)
        index.add([IndexEntry(f"r{i}", T0 - rng.randrange(3 * HOUR), rng.choice(list(Priority))) for i in range(600)])
        stop = f"{prefix}:stop-monitoring"
        seen: list[tuple[str, list[str]]] = []  # (client type, the command's first words)
        ready = threading.Event()

        watcher_client = redis.Redis.from_url(require_redis())

        def watch() -> None:
            with watcher_client.monitor() as m:  # MONITOR shows each command a script runs, as client "lua"
                ready.set()
                for line in m.listen():
                    if stop in line["command"]:
                        return
                    if prefix in line["command"]:
                        seen.append((line["client_type"], line["command"].split(" ", 4)[:4]))

        watcher = threading.Thread(target=watch)
        watcher.start()
        assert ready.wait(5)
        assert len(index.claim_due(T0, 600)) == 600
        client.exists(stop)
        watcher.join(10)
        watcher_client.close()
        scripted = 0
        current: str | None = None
        for client_type, words in seen:
            if client_type == "lua":
                assert words[1] == current, f"a script touched {words[1]} while called on {current}"
            elif words[0] == "EVALSHA":
                assert words[2] == "1"  # numkeys
                scripted += 1
                current = words[3]
            else:
                current = None
        assert scripted > 0


# -- members ------------------------------------------------------------------------------------------


class TestMembers:
    @pytest.mark.parametrize(
        "run_id",
        [
            "job_x:123",
            "job_01m8kgzfepze1pcj15qwbw256f:1790000000000",
            "job_71m8kgzfepze1pcj15qwbw256f:0",
            "job_01m8kgzfepze1pcj15qwbw256f:01790000000000",
            "job_81m8kgzfepze1pcj15qwbw256f:1790000000000",  # 130 bits: does not fit 16 bytes
            "job_01m8kgzfepze1pcj15qwbw256f:999999999999999",  # fire time beyond 48 bits
            "Zürich:täglich:日本:🙂",
            "acme/job_01m8kgzfepze1pcj15qwbw256f:1790000000000",
            "acme/job_x:1",  # another tenant's custom job id: verbatim
            "a/b/job_01m8kgzfepze1pcj15qwbw256f:1",
            "/job_01m8kgzfepze1pcj15qwbw256f:1",
            ":::",
            "",
        ],
    )
    def test_a_run_id_survives_encoding(self, run_id: str) -> None:
        assert decode_member(encode_member(run_id)) == run_id

    def test_ids_made_by_jobq_are_stored_in_22_bytes(self) -> None:
        for _ in range(100):
            run_id = f"{new_job_id(random.randrange(2**45))}:{random.randrange(2**48)}"
            assert len(encode_member(run_id)) == 22
            assert decode_member(encode_member(run_id)) == run_id

    def test_a_verbatim_member_cannot_be_mistaken_for_a_compact_one(self) -> None:
        assert encode_member("job_x:1")[0] == 0xFF
        assert all(encode_member(f"{new_job_id(T0)}:{T0}")[0] < 0xFF for _ in range(100))

    @given(st.text())
    def test_any_text_survives_encoding(self, run_id: str) -> None:
        assert decode_member(encode_member(run_id)) == run_id

    @given(st.from_regex(r"job_[0-7][0-9a-hjkmnp-tv-z]{25}:(0|[1-9][0-9]{0,14})", fullmatch=True))
    def test_any_canonical_id_survives_encoding(self, run_id: str) -> None:
        assert decode_member(encode_member(run_id)) == run_id

    @given(
        st.from_regex(r"[A-Za-z0-9_.\-]{1,128}/job_[0-7][0-9a-hjkmnp-tv-z]{25}:(0|[1-9][0-9]{0,14})", fullmatch=True)
    )
    def test_any_run_id_of_another_tenant_survives_encoding(self, run_id: str) -> None:
        assert decode_member(encode_member(run_id)) == run_id

    def test_runs_of_tenants_other_than_default_take_3_bytes_and_the_tenant_more(self) -> None:
        for tenant in ("acme", "t" * 128, "a.b-c_9"):
            run_id = f"{tenant}/{new_job_id(random.randrange(2**45))}:{random.randrange(2**48)}"
            assert len(encode_member(run_id)) == 22 + 3 + len(tenant)
            assert decode_member(encode_member(run_id)) == run_id
        # a job id whose first byte is 0xFF cannot be compact alone, but can be behind a tenant
        top = f"job_7{'z' * 25}:5"
        assert encode_member(top)[0] == 0xFF and len(encode_member(top)) == 1 + len(top)
        assert len(encode_member(f"acme/{top}")) == 22 + 3 + 4
        assert decode_member(encode_member(f"acme/{top}")) == f"acme/{top}"

    def test_ids_with_unicode_and_colons_come_back_from_the_server(
        self, make_index: Callable[..., RedisTimeIndex]
    ) -> None:
        ids = ["job_x:123", "a:b:c", "été:12:34", "日本:0", f"{new_job_id(T0)}:{T0}", "x" * 100]
        index = make_index()
        index.add([IndexEntry(r, T0 - i, C) for i, r in enumerate(ids)])
        assert index.claim_due(T0, 10) == ids[::-1]


# -- scanners -----------------------------------------------------------------------------------------


def spread(index: RedisTimeIndex, count: int = 600) -> dict[str, int]:
    """Runs over many buckets (minutes and tiers), all due in the four hours before T0: id -> due ms."""
    rng = random.Random(9)
    runs = {f"run{i:04}": (T0 - 1 - rng.randrange(4 * HOUR), rng.choice(list(Priority))) for i in range(count)}
    index.add([IndexEntry(r, due, p) for r, (due, p) in runs.items()])
    return {r: due for r, (due, _) in runs.items()}


def join(*scanners: RedisTimeIndex, at_ms: int) -> None:
    """Heartbeat every scanner at `at_ms`, then again so that each one sees all the others."""
    for _ in range(2):
        for scanner in scanners:
            assert scanner.membership is not None
            scanner.membership.heartbeat(at_ms)


class TestScanners:
    def test_two_scanners_split_the_buckets_and_claim_only_their_own(
        self, client: Any, prefix: str, make_index: Callable[..., RedisTimeIndex]
    ) -> None:
        base = make_index()
        a, b = base.for_scanner("scanner-a"), base.for_scanner("scanner-b")
        runs = spread(base)
        join(a, b, at_ms=T0)
        assert a.membership is not None and a.membership.live == ("scanner-a", "scanner-b")
        buckets = members_by_bucket(client, prefix)
        owner = {r: a.membership.owner(bucket) for bucket, ids in buckets.items() for r in ids}
        got_a, got_b = a.claim_due(T0, 5000), b.claim_due(T0, 5000)
        assert got_a and got_b
        assert {owner[r] for r in got_a} == {"scanner-a"} and {owner[r] for r in got_b} == {"scanner-b"}
        assert sorted(got_a + got_b) == sorted(runs)

    def test_when_a_scanner_stops_heartbeating_another_owns_all_its_buckets(
        self, make_index: Callable[..., RedisTimeIndex]
    ) -> None:
        base = make_index(membership_ttl_s=10)
        a, b = base.for_scanner("scanner-a"), base.for_scanner("scanner-b")
        runs = spread(base)
        join(a, b, at_ms=T0)
        share = a.claim_due(T0 + 1, 5000)  # b is live: a takes only its own buckets
        assert 0 < len(share) < len(runs)
        rest = a.claim_due(T0 + 10_001, 5000)  # b has been silent for longer than the TTL
        assert a.membership is not None and a.membership.live == ("scanner-a",)
        assert sorted(share + rest) == sorted(runs)

    def test_a_scanner_that_leaves_hands_its_buckets_over_at_once(
        self, make_index: Callable[..., RedisTimeIndex]
    ) -> None:
        base = make_index()
        a, b = base.for_scanner("scanner-a"), base.for_scanner("scanner-b")
        runs = spread(base)
        join(a, b, at_ms=T0)
        b.close()
        assert a.membership is not None
        a.membership.heartbeat(T0 + 1)
        assert sorted(a.claim_due(T0 + 1, 5000)) == sorted(runs)

    def test_when_one_of_three_scanners_leaves_only_its_buckets_change_owner(self) -> None:
        index = RedisTimeIndex(fake_redis(), prefix="p")
        views = {name: index.for_scanner(name) for name in ("a", "b", "c")}
        for view in views.values():
            assert view.membership is not None
            view.membership.heartbeat(T0)
        a = views["a"].membership
        assert a is not None
        a.heartbeat(T0)
        buckets = [f"HIGH:2026092114{m:02}:abcde.{n}" for m in range(60) for n in range(20)]
        before = {bucket: a.owner(bucket) for bucket in buckets}
        views["c"].close()
        a.heartbeat(T0 + 1)
        after = {bucket: a.owner(bucket) for bucket in buckets}
        assert set(before.values()) == {"a", "b", "c"} and set(after.values()) == {"a", "b"}
        assert all(after[b] == before[b] for b in buckets if before[b] != "c")
        assert 0.25 < sum(1 for b in buckets if before[b] == "c") / len(buckets) < 0.42

    def test_next_due_counts_only_the_scanners_own_buckets(self, make_index: Callable[..., RedisTimeIndex]) -> None:
        base = make_index()
        a, b = base.for_scanner("scanner-a"), base.for_scanner("scanner-b")
        spread(base)
        join(a, b, at_ms=T0)
        a_next, b_next, both = a.next_due_ms(), b.next_due_ms(), base.next_due_ms()
        assert a_next is not None and b_next is not None
        assert min(a_next, b_next) == both and a_next != b_next

    def test_scanners_claiming_concurrently_while_one_leaves_lose_nothing(
        self, make_index: Callable[..., RedisTimeIndex]
    ) -> None:
        base = make_index(membership_ttl_s=1)
        runs = spread(base, 3000)
        scanners = [base.for_scanner(f"scanner-{n}") for n in range(3)]
        taken: list[list[str]] = [[] for _ in scanners]
        clock = iter(range(T0, T0 + 10**9, 200))
        lock = threading.Lock()

        def now() -> int:
            with lock:
                return next(clock)

        def scan(index: RedisTimeIndex, mine: list[str], passes: int) -> None:
            for _ in range(passes):
                mine += index.claim_due(now(), 50)

        passes = [400, 400, 4]  # the third scanner stops early: the others must take its buckets over
        threads = [
            threading.Thread(target=scan, args=(s, t, n)) for s, t, n in zip(scanners, taken, passes, strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        claimed = [r for t in taken for r in t]
        assert len(claimed) == len(set(claimed))
        assert set(claimed) == set(runs)


# -- cost ---------------------------------------------------------------------------------------------


class TestRoundTrips:
    def test_an_idle_claim_costs_one_round_trip_whatever_the_backlog(
        self, make_index: Callable[..., RedisTimeIndex]
    ) -> None:
        index = make_index()
        before = index.round_trips
        assert index.claim_due(T0, 500) == []
        empty = index.round_trips - before
        index.add(
            [IndexEntry(f"r{i}", T0 + MINUTE + i * 100, Priority(p)) for i, p in enumerate(list(Priority) * 2500)]
        )
        before = index.round_trips
        assert index.claim_due(T0, 500) == []
        backlog = index.round_trips - before
        assert empty == backlog == 1

    def test_next_due_costs_three_round_trips_then_one_while_nothing_changes(
        self, make_index: Callable[..., RedisTimeIndex]
    ) -> None:
        index = make_index()
        index.add([IndexEntry(f"r{i}", T0 + MINUTE + i * 100, D) for i in range(10_000)])
        costs = []
        for _ in range(3):
            before = index.round_trips
            assert index.next_due_ms() == T0 + MINUTE
            costs.append(index.round_trips - before)
        assert costs == [3, 1, 1]

    def test_next_due_is_never_late_for_a_run_another_process_adds(
        self, make_index: Callable[..., RedisTimeIndex]
    ) -> None:
        scanner, beat = make_index(), make_index()
        beat.add([IndexEntry("later", T0 + HOUR, L)])
        assert scanner.next_due_ms() == T0 + HOUR
        assert scanner.next_due_ms() == T0 + HOUR  # from what it checked before
        beat.add([IndexEntry("earlier_same_bucket", T0 + HOUR - 1000, L)])  # T0 is 20 s into its minute
        assert scanner.next_due_ms() == T0 + HOUR - 1000
        beat.add([IndexEntry("sooner", T0 + MINUTE, L)])
        assert scanner.next_due_ms() == T0 + MINUTE
        scanner.claim_due(T0 + MINUTE, 10)
        assert scanner.next_due_ms() == T0 + HOUR - 1000

    def test_next_due_looks_again_once_a_bound_has_moved(self, make_index: Callable[..., RedisTimeIndex]) -> None:
        scanner, client_side = make_index(), make_index()
        scanner.add([IndexEntry("first", T0, H), IndexEntry("second", T0 + 1000, H)])  # one bucket
        assert scanner.next_due_ms() == T0
        client_side.discard(["second"])  # another process: the scanner's own view is not told
        assert scanner.claim_due(T0, 10) == ["first"]  # the bound moves up to the stale "second"
        assert scanner.next_due_ms() is None

    def test_a_full_claim_is_a_handful_of_round_trips(self, make_index: Callable[..., RedisTimeIndex]) -> None:
        index = make_index()
        index.add([IndexEntry(f"r{i}", T0 - i * 10, H) for i in range(2000)])
        before = index.round_trips
        assert len(index.claim_due(T0, 500)) == 500
        assert index.round_trips - before <= 4


# -- the edge: URLs and errors ------------------------------------------------------------------------


class TestEdge:
    def test_from_url_reads_the_prefix_and_capacity(self, prefix: str) -> None:
        index = RedisTimeIndex.from_url(f"{require_redis()}?prefix={prefix}&capacity=5000")
        try:
            index.add([IndexEntry("r", T0, D)])
            assert index.prefix == prefix and index.capacity == 5000
            assert index.claim_due(T0, 1) == ["r"]
        finally:
            index.close()

    @pytest.mark.parametrize(
        "url",
        ["http://127.0.0.1:6379", "redis://127.0.0.1:6379?capacity=lots", "redis://127.0.0.1:6379?cluster=maybe"],
    )
    def test_a_bad_url_is_a_config_error(self, url: str) -> None:
        with pytest.raises(ConfigError):
            RedisTimeIndex.from_url(url)

    def test_an_unreachable_server_raises_store_unavailable(self) -> None:
        index = RedisTimeIndex.from_url(f"redis://127.0.0.1:{free_port()}/0?socket_connect_timeout=0.2")
        with pytest.raises(StoreUnavailable) as raised:
            index.claim_due(T0, 10)
        assert type(raised.value) is StoreUnavailable and raised.value.retryable
        index.close()

    def test_cluster_true_asks_for_a_cluster(self) -> None:
        url = require_redis()
        with pytest.raises(StoreUnavailable, match="cannot reach"):  # this server is not a cluster
            RedisTimeIndex.from_url(f"{url}?cluster=true")

    def test_a_key_of_the_wrong_type_raises_a_store_error(
        self, client: Any, prefix: str, make_index: Callable[..., RedisTimeIndex]
    ) -> None:
        client.set(f"{prefix}:buckets:CRITICAL", "not a sorted set")
        with pytest.raises(StoreError) as raised:
            make_index().claim_due(T0, 10)
        assert type(raised.value) is StoreError and not raised.value.retryable

    def test_a_missing_redis_package_is_a_one_line_error(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setitem(sys.modules, "redis", None)
        with pytest.raises(MissingExtra, match=r"pip install 'jobq\[redis\]'"):
            RedisTimeIndex.from_url("redis://127.0.0.1:6379")

    def test_a_flushed_script_cache_is_reloaded(self) -> None:
        client = fake_redis()  # never SCRIPT FLUSH the shared server
        index = RedisTimeIndex(client, prefix="p")
        index.add([IndexEntry("a", T0, D), IndexEntry("b", T0, D)])
        assert index.claim_due(T0, 1) == ["a"]
        client.script_flush()
        assert index.claim_due(T0, 1) == ["b"]


# -- Redis Cluster -------------------------------------------------------------------------------------


def cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    while True:
        port = free_port()
        if port + 10_000 <= 65_535 and not port_open("127.0.0.1", port + 10_000, 0.05):
            return port


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[str]:
    """Three primaries started for the test, on free ports, with nothing saved to disk."""
    if not (have_binary("redis-server") and have_binary("redis-cli")):
        pytest.skip("redis-server and redis-cli are needed to start a throwaway cluster")
    ports = [cluster_port() for _ in range(3)]
    procs = [
        subprocess.Popen(
            [
                *(
                    "redis-server",
                    "--port",
                    str(p),
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    f"nodes-{p}.conf",
                ),
                *("--save", "", "--appendonly", "no", "--dir", str(tmp_path)),
            ],
            stdout=subprocess.DEVNULL,
        )
        for p in ports
    ]
    try:
        deadline = time.monotonic() + 10
        while not all(
            subprocess.run(["redis-cli", "-p", str(p), "ping"], check=False, capture_output=True).stdout for p in ports
        ):
            assert time.monotonic() < deadline, "cluster nodes did not start"
            time.sleep(0.05)
        nodes = [f"127.0.0.1:{p}" for p in ports]
        subprocess.run(
            ["redis-cli", "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
        )
        while (
            b"cluster_state:ok"
            not in subprocess.run(
                ["redis-cli", "-p", str(ports[0]), "cluster", "info"], check=False, capture_output=True
            ).stdout
        ):
            assert time.monotonic() < deadline, "the cluster did not become ready"
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{ports[0]}?cluster=true"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


@pytest.mark.slow
def test_the_index_works_on_a_redis_cluster(redis_cluster: str) -> None:
    index = RedisTimeIndex.from_url(f"{redis_cluster}&prefix=jobq")
    try:
        runs = spread(index, 2000)
        index.add([IndexEntry("moved", T0 - 5 * HOUR, C), IndexEntry("dropped", T0 - 5 * HOUR, C)])
        index.add([IndexEntry("moved", T0 + HOUR, C)])
        index.discard(["dropped"])
        assert index.next_due_ms() == min(runs.values())
        first = index.claim_due(T0, 1000)
        assert len(first) == 1000
        rest = index.claim_due(T0, 5000)
        assert sorted(first + rest) == sorted(runs)
        assert index.next_due_ms() == T0 + HOUR
        assert index.claim_due(T0 + HOUR, 10) == ["moved"]
    finally:
        index.close()


# -- TLS -----------------------------------------------------------------------------------------------


@pytest.fixture
def redis_tls(tmp_path: Path) -> Iterator[str]:
    """A TLS-only server started for the test, with a throwaway self-signed certificate."""
    if not (have_binary("redis-server") and have_binary("openssl")):
        pytest.skip("redis-server and openssl are needed to start a throwaway TLS server")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            *("redis-server", "--port", "0", "--tls-port", str(port), "--tls-auth-clients", "no"),
            *("--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert)),
            *("--save", "", "--appendonly", "no", "--dir", str(tmp_path)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 10
        while not port_open("127.0.0.1", port, 0.05):
            if proc.poll() is not None:
                pytest.skip(f"this redis-server has no TLS: {proc.stdout.read()[-200:] if proc.stdout else b''!r}")
            assert time.monotonic() < deadline, "the TLS server did not start"
            time.sleep(0.05)
        yield f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}"
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


@pytest.mark.slow
def test_the_index_works_over_tls(redis_tls: str) -> None:
    index = RedisTimeIndex.from_url(f"{redis_tls}&prefix=jobq")
    try:
        index.add([IndexEntry("job_x:1", T0, H), IndexEntry("job_x:2", T0 + 1, C)])
        assert index.next_due_ms() == T0
        assert index.claim_due(T0 + 1, 10) == ["job_x:2", "job_x:1"]
    finally:
        index.close()


def test_a_look_ahead_claim_reaches_into_the_next_minute_s_bucket(make_index: Callable[..., RedisTimeIndex]) -> None:
    """The scanner's look-ahead claims `claim_due(now + lookahead)`: a run due just after the
    minute boundary, in the next bucket, is found before its minute has begun."""
    index = make_index()
    minute_end = (wall_ms() // 60_000 + 2) * 60_000  # a boundary ahead of the wall clock
    index.add(
        [
            IndexEntry("job_a:1", minute_end + 100, Priority.DEFAULT),
            IndexEntry("job_b:1", minute_end + 900, Priority.DEFAULT),
        ]
    )
    assert index.claim_due(minute_end - 200, 10) == []
    assert index.claim_due(minute_end + 150, 10) == ["job_a:1"]
