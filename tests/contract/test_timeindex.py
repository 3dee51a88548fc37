"""The TimeIndex contract for indexes that hold their own copy of the schedule: every backend must
pass every test here against its real server. (The SQLite index is a view of the store, with
other semantics: nothing to add or discard. It is tested with the store.)"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import pytest
from factories import T0
from services import require_redis

from jobq.ids import new_job_id
from jobq.models import Priority
from jobq.ports import IndexEntry, TimeIndex
from jobq.timeindex.memory import MemoryTimeIndex

MINUTE = 60_000
HOUR = 60 * MINUTE
C, H, D, L = Priority.CRITICAL, Priority.HIGH, Priority.DEFAULT, Priority.LOW


@contextmanager
def _memory() -> Iterator[TimeIndex]:
    yield MemoryTimeIndex()


@contextmanager
def _redis() -> Iterator[TimeIndex]:
    url = require_redis()
    redis = pytest.importorskip("redis", reason="the redis backend needs jobq[redis]")
    from jobq.timeindex.redis import RedisTimeIndex

    client = redis.Redis.from_url(url)
    prefix = f"jobq-test-{uuid.uuid4().hex[:12]}"  # the server is shared: never flush it
    index = RedisTimeIndex(client, prefix=prefix)
    try:
        yield index
    finally:
        index.close()
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


@contextmanager
def _fakeredis() -> Iterator[TimeIndex]:
    fakeredis = pytest.importorskip("fakeredis", reason="the fakeredis backend needs fakeredis[lua]")
    from jobq.timeindex.redis import RedisTimeIndex

    client = fakeredis.FakeRedis()  # a server of its own per test
    index = RedisTimeIndex(client, prefix="jobq")
    try:
        yield index
    finally:
        index.close()
        client.close()


# Backends register here; a server-backed one skips locally (and fails in CI) when its server is absent.
INDEXES: dict[str, Callable[[], AbstractContextManager[TimeIndex]]] = {
    "memory": _memory,
    "redis": _redis,
    "fakeredis": _fakeredis,
}


@pytest.fixture(params=sorted(INDEXES))
def index(request: pytest.FixtureRequest) -> Iterator[TimeIndex]:
    with INDEXES[request.param]() as backend:
        yield backend


def entry(run_id: str, due_ms: int, priority: Priority = D) -> IndexEntry:
    return IndexEntry(run_id, due_ms, priority)


def drain(index: TimeIndex, now_ms: int, batch: int = 1000) -> list[str]:
    out: list[str] = []
    while got := index.claim_due(now_ms, batch):
        out += got
    return out


class TestClaiming:
    def test_an_empty_index_claims_nothing(self, index: TimeIndex) -> None:
        assert index.claim_due(T0, 100) == []
        assert index.next_due_ms() is None

    def test_only_runs_due_by_now_are_claimed(self, index: TimeIndex) -> None:
        index.add(
            [entry("early", T0 - 5 * MINUTE), entry("now", T0), entry("later", T0 + 1), entry("next_hour", T0 + HOUR)]
        )
        assert index.claim_due(T0, 100) == ["early", "now"]

    def test_runs_not_yet_due_stay_until_they_are(self, index: TimeIndex) -> None:
        index.add([entry("later", T0 + 1), entry("next_hour", T0 + HOUR)])
        assert index.claim_due(T0, 100) == []
        assert index.claim_due(T0 + 1, 100) == ["later"]
        assert index.claim_due(T0 + HOUR - 1, 100) == []
        assert index.claim_due(T0 + HOUR, 100) == ["next_hour"]

    def test_critical_runs_come_before_lower_tiers_whatever_their_due_times(self, index: TimeIndex) -> None:
        index.add(
            [
                entry("low", T0 - 3 * HOUR, L),
                entry("default", T0 - 2 * HOUR, D),
                entry("high", T0 - MINUTE, H),
                entry("critical", T0, C),
            ]
        )
        assert index.claim_due(T0, 100) == ["critical", "high", "default", "low"]

    def test_a_lower_tier_waits_while_the_limit_is_spent_on_a_higher_one(self, index: TimeIndex) -> None:
        index.add([entry("low", T0 - HOUR, L)] + [entry(f"c{i}", T0 - i, C) for i in range(3)])
        assert index.claim_due(T0, 3) == ["c2", "c1", "c0"]
        assert index.claim_due(T0, 3) == ["low"]

    def test_within_a_tier_runs_come_by_due_time(self, index: TimeIndex) -> None:
        dues = [T0 - 3 * HOUR, T0 - 61_000, T0 - 59_000, T0 - 1_000, T0 - 999, T0]
        shuffled = random.Random(7).sample(range(len(dues)), len(dues))
        index.add([entry(f"r{i}", dues[i], H) for i in shuffled])
        assert index.claim_due(T0, 100) == [f"r{i}" for i in range(len(dues))]

    def test_the_limit_is_honoured_and_the_rest_come_with_the_next_claims(self, index: TimeIndex) -> None:
        index.add([entry(f"r{i:02}", T0 - 10 * MINUTE + i * 1000) for i in range(10)])
        assert index.claim_due(T0, 4) == ["r00", "r01", "r02", "r03"]
        assert index.claim_due(T0, 4) == ["r04", "r05", "r06", "r07"]
        assert index.claim_due(T0, 4) == ["r08", "r09"]
        assert index.claim_due(T0, 4) == []

    def test_a_claimed_run_is_not_claimed_again(self, index: TimeIndex) -> None:
        index.add([entry("once", T0)])
        assert index.claim_due(T0, 10) == ["once"]
        assert index.claim_due(T0 + HOUR, 10) == []

    def test_a_limit_of_zero_claims_nothing(self, index: TimeIndex) -> None:
        index.add([entry("due", T0)])
        assert index.claim_due(T0, 0) == []
        assert index.claim_due(T0, 1) == ["due"]

    def test_runs_due_over_several_hours_are_claimed_as_each_comes_due(self, index: TimeIndex) -> None:
        rng = random.Random(11)
        runs = {f"run{i:03}": (T0 + rng.randrange(6 * HOUR), rng.choice(list(Priority))) for i in range(400)}
        index.add([entry(run_id, due, p) for run_id, (due, p) in runs.items()])
        claimed: list[str] = []
        for now in range(T0, T0 + 6 * HOUR + 1, 30 * MINUTE):
            got = index.claim_due(now, 1000)
            assert all(runs[r][0] <= now for r in got)
            ranks = [runs[r][1].rank for r in got]
            assert ranks == sorted(ranks)
            for rank in set(ranks):
                dues = [runs[r][0] for r in got if runs[r][1].rank == rank]
                assert dues == sorted(dues)
            claimed += got
        assert sorted(claimed) == sorted(runs)

    def test_a_busy_minute_is_claimed_in_full(self, index: TimeIndex) -> None:
        minute = T0 - T0 % MINUTE
        runs = {f"job_{i:04}:{T0}": minute + i * 50 for i in range(1000)}  # one tier, one minute
        index.add([entry(r, due) for r, due in runs.items()])
        batches = [index.claim_due(minute + MINUTE, 150) for _ in range(8)]
        assert [len(b) for b in batches] == [150] * 6 + [100, 0]
        claimed = [r for b in batches for r in b]
        assert sorted(claimed) == sorted(runs)


class TestAdding:
    def test_adding_a_run_again_moves_it_later(self, index: TimeIndex) -> None:
        index.add([entry("moved", T0 - HOUR, H), entry("same_minute", T0 - 1000)])
        index.add([entry("moved", T0 + HOUR, H), entry("same_minute", T0 + 1000)])
        assert index.claim_due(T0, 10) == []
        assert index.claim_due(T0 + HOUR, 10) == ["moved", "same_minute"]
        assert index.claim_due(T0 + 2 * HOUR, 10) == []

    def test_adding_a_run_again_moves_it_earlier(self, index: TimeIndex) -> None:
        index.add([entry("moved", T0 + 3 * HOUR, L)])
        index.add([entry("moved", T0 - MINUTE, L)])
        assert index.claim_due(T0, 10) == ["moved"]
        assert index.claim_due(T0 + 4 * HOUR, 10) == []

    def test_adding_a_run_again_with_another_priority_moves_it_to_that_tier(self, index: TimeIndex) -> None:
        index.add([entry("aged", T0 - HOUR, L), entry("other", T0 - 2 * HOUR, H)])
        index.add([entry("aged", T0 - HOUR, C)])
        assert index.claim_due(T0, 10) == ["aged", "other"]
        assert index.claim_due(T0, 10) == []

    def test_adding_the_same_entry_twice_indexes_it_once(self, index: TimeIndex) -> None:
        index.add([entry("twice", T0)])
        index.add([entry("twice", T0), entry("twice", T0)])
        assert index.claim_due(T0, 10) == ["twice"]
        assert index.claim_due(T0, 10) == []

    def test_a_claimed_run_added_again_comes_due_again(self, index: TimeIndex) -> None:
        index.add([entry("retried", T0)])
        assert index.claim_due(T0, 10) == ["retried"]
        index.add([entry("retried", T0 + 30_000)])
        assert index.claim_due(T0 + 29_999, 10) == []
        assert index.claim_due(T0 + 30_000, 10) == ["retried"]

    def test_run_ids_come_back_exactly(self, index: TimeIndex) -> None:
        ids = [
            f"{new_job_id(T0)}:{T0}",
            f"{new_job_id(T0)}:0",
            "job_x:123",
            "job_01m8kgzfepze1pcj15qwbw256f:01790000000000",  # leading zero: not the canonical form
            "job_01M8KGZFEPZE1PCJ15QWBW256F:1790000000000",  # upper case
            "täglich:Zürich:é:日本",
            "a:b:c:",
            "with space",
            "",
            "x" * 300,
        ]
        index.add([entry(run_id, T0 - i) for i, run_id in enumerate(ids)])
        assert sorted(index.claim_due(T0, 100)) == sorted(ids)


class TestDiscarding:
    def test_discarded_runs_are_never_claimed(self, index: TimeIndex) -> None:
        index.add([entry("kept", T0), entry("dropped", T0 - MINUTE), entry("dropped_later", T0 + HOUR, C)])
        index.discard(["dropped", "dropped_later"])
        assert index.claim_due(T0 + 2 * HOUR, 10) == ["kept"]

    def test_discarding_absent_runs_is_harmless(self, index: TimeIndex) -> None:
        index.add([entry("kept", T0)])
        index.discard(["never_added", "kept_not"])
        index.discard([])
        assert index.claim_due(T0, 10) == ["kept"]

    def test_a_discarded_run_added_again_is_claimable(self, index: TimeIndex) -> None:
        index.add([entry("paused", T0)])
        index.discard(["paused"])
        index.add([entry("paused", T0 + MINUTE)])
        assert index.claim_due(T0 + MINUTE, 10) == ["paused"]


class TestNextDue:
    def test_next_due_is_the_earliest_due_time_of_any_tier(self, index: TimeIndex) -> None:
        index.add([entry("c", T0 + HOUR, C), entry("l", T0 + 5, L), entry("d", T0 + 7, D)])
        assert index.next_due_ms() == T0 + 5

    def test_next_due_moves_on_as_runs_are_claimed(self, index: TimeIndex) -> None:
        index.add([entry("a", T0), entry("b", T0 + 2 * MINUTE), entry("c", T0 + HOUR)])
        index.claim_due(T0, 10)
        assert index.next_due_ms() == T0 + 2 * MINUTE
        index.claim_due(T0 + 2 * MINUTE, 10)
        assert index.next_due_ms() == T0 + HOUR
        index.claim_due(T0 + HOUR, 10)
        assert index.next_due_ms() is None

    def test_next_due_ignores_discarded_and_moved_runs(self, index: TimeIndex) -> None:
        index.add([entry("discarded", T0), entry("moved", T0 + 1), entry("stays", T0 + 2 * HOUR)])
        index.discard(["discarded"])
        index.add([entry("moved", T0 + 3 * HOUR)])
        assert index.next_due_ms() == T0 + 2 * HOUR


class TestConcurrency:
    def test_concurrent_claimers_never_share_a_run_and_together_take_all(self, index: TimeIndex) -> None:
        rng = random.Random(5)
        runs = [f"run{i:04}" for i in range(2000)]
        index.add([entry(r, T0 - rng.randrange(20 * MINUTE), rng.choice(list(Priority))) for r in runs])
        taken: list[list[str]] = [[] for _ in range(8)]

        def claimer(mine: list[str]) -> None:
            while got := index.claim_due(T0, 37):
                mine += got

        threads = [threading.Thread(target=claimer, args=(t,)) for t in taken]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        claimed = [r for t in taken for r in t]
        assert len(claimed) == len(set(claimed))
        assert sorted(claimed) == runs

    def test_runs_added_while_others_claim_are_all_claimed_once(self, index: TimeIndex) -> None:
        runs = [f"run{i:04}" for i in range(1500)]
        done = threading.Event()
        taken: list[list[str]] = [[] for _ in range(4)]

        def adder() -> None:
            for i in range(0, len(runs), 50):
                index.add([entry(r, T0 - (j % 7) * 1000, Priority.HIGH) for j, r in enumerate(runs[i : i + 50])])
            done.set()

        def claimer(mine: list[str]) -> None:
            while not done.is_set():
                mine += index.claim_due(T0, 20)
            mine += drain(index, T0, 20)

        threads = [threading.Thread(target=adder)] + [threading.Thread(target=claimer, args=(t,)) for t in taken]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        claimed = [r for t in taken for r in t] + drain(index, T0)
        assert len(claimed) == len(set(claimed))
        assert sorted(claimed) == runs
