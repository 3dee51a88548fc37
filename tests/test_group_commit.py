"""Group commit of submissions (issue 14): concurrent `submit` calls share one store transaction,
each returning once its own job is durable, with its own outcome; a lone caller commits at once.

Run on real SQLite and real PostgreSQL (+ Redis index, RabbitMQ broker). To make a group happen
deterministically, the store's first group write is held until the callers under test have
queued behind it; the store is otherwise the real one."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from held import HeldStore
from stacks import Stack, stack

from jobq.app import App
from jobq.client import Client, Submitted, _group
from jobq.deployment import Deployment
from jobq.errors import DuplicateJob, IdempotencyConflict, StoreUnavailable
from jobq.groupcommit import GroupCommit
from jobq.models import JobKey, RunState
from jobq.ports import RunQuery
from jobq.settings import Settings
from jobq.wiring import connect

TASK = "tests.group.noop"


@pytest.fixture(params=["sqlite", "postgres-redis-rabbitmq"])
def deployed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    with stack(request.param, tmp_path) as built:
        yield built


@pytest.fixture
def held(deployed: Stack) -> Iterator[tuple[Deployment, HeldStore]]:
    d = deployed.connect()
    store = HeldStore(d.store)
    try:
        yield dataclasses.replace(d, store=store), store
    finally:
        store.release.set()
        d.close()


def spec(job_id: str, **fields: Any) -> dict[str, Any]:
    return {"job_id": job_id, "schedule_type": "IMMEDIATE", "target": {"type": "TASK", "task": TASK}, **fields}


def start_in_order(
    d: Deployment, store: HeldStore, calls: Sequence[Callable[[Client], Submitted]]
) -> tuple[ThreadPoolExecutor, list[Future[Submitted]]]:
    """Start each call on a thread of its own, the next only once the one before is queued: the
    first is held inside the store, the rest wait for the next group in this order."""
    pool = ThreadPoolExecutor(max_workers=len(calls))
    group = _group(store)
    futures: list[Future[Submitted]] = []
    for i, call in enumerate(calls):
        futures.append(pool.submit(call, Client(d)))
        if i == 0:
            assert store.entered.wait(30)
        else:
            _until(lambda i=i: group.waiting == i)
    return pool, futures


def _until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def read_back(deployed: Stack, job_ids: Sequence[str]) -> set[str]:
    """The jobs among `job_ids` that a fresh connection finds: what was committed."""
    d = deployed.connect()
    try:
        return {k.job_id for k in d.store.get_jobs([JobKey("default", j) for j in job_ids])}
    finally:
        d.close()


# -- the leader/follower core, on its own ---------------------------------------------------------


def test_a_lone_caller_commits_on_its_own_thread_at_once() -> None:
    seen: list[tuple[list[int], threading.Thread]] = []

    def commit(items: list[int]) -> list[int]:
        seen.append((items, threading.current_thread()))
        return [i * 10 for i in items]

    group: GroupCommit[int, int] = GroupCommit(commit)
    assert group(1) == 10
    assert group(2) == 20
    assert seen == [([1], threading.current_thread()), ([2], threading.current_thread())]


def test_callers_that_arrive_during_a_commit_form_the_next_group_in_arrival_order() -> None:
    gate, entered = threading.Event(), threading.Event()
    groups: list[list[int]] = []

    def commit(items: list[int]) -> list[int | BaseException]:
        if not entered.is_set():
            entered.set()
            gate.wait(10)
        groups.append(items)
        return [ValueError(i) if i == 3 else i for i in items]

    group: GroupCommit[int, int] = GroupCommit(commit)
    with ThreadPoolExecutor(max_workers=5) as pool:
        futures = [pool.submit(group, 0)]
        assert entered.wait(10)
        for i in range(1, 5):
            futures.append(pool.submit(group, i))
            _until(lambda i=i: group.waiting == i)
        gate.set()
        assert [f.result() for f in (futures[0], futures[1], futures[2], futures[4])] == [0, 1, 2, 4]
        with pytest.raises(ValueError):
            futures[3].result()
    assert groups == [[0], [1, 2, 3, 4]]


def test_a_commit_that_raises_fails_every_caller_of_its_group_and_the_next_group_still_runs() -> None:
    calls: list[list[int]] = []
    gate = threading.Event()

    def commit(items: list[int]) -> list[int]:
        calls.append(items)
        if len(calls) == 1:
            gate.wait(10)
            return items
        if len(calls) == 2:
            raise StoreUnavailable("down")
        return items

    group: GroupCommit[int, int] = GroupCommit(commit)
    with ThreadPoolExecutor(max_workers=3) as pool:
        first = pool.submit(group, 0)
        _until(lambda: len(calls) == 1)
        rest = [pool.submit(group, 1), pool.submit(group, 2)]
        _until(lambda: group.waiting == 2)
        gate.set()
        assert first.result() == 0
        for f in rest:
            with pytest.raises(StoreUnavailable):
                f.result()
    assert group(3) == 3  # nothing is left stuck


class _Killed(BaseException):
    """What a killed greenlet or a KeyboardInterrupt raises in the leading thread."""


def test_a_leader_torn_down_mid_commit_answers_its_group_before_it_unwinds() -> None:
    gate, entered = threading.Event(), threading.Event()

    def commit(items: list[int]) -> list[int]:
        if items == [0]:
            entered.set()
            gate.wait(10)
        elif 1 in items:
            raise _Killed  # the leader of the second group is torn down while committing it
        return items

    group: GroupCommit[int, int] = GroupCommit(commit, parallel=1)
    with ThreadPoolExecutor(max_workers=3) as pool:
        first = pool.submit(group, 0)
        assert entered.wait(10)
        leader = pool.submit(group, 1)
        _until(lambda: group.waiting == 1)
        follower = pool.submit(group, 2)
        _until(lambda: group.waiting == 2)
        gate.set()
        assert first.result(timeout=10) == 0
        with pytest.raises(_Killed):
            leader.result(timeout=10)
        with pytest.raises(StoreUnavailable, match="outcome is unknown"):
            follower.result(timeout=10)
    assert group(3) == 3  # and the next caller is not stuck behind it


# -- submissions on real stores -------------------------------------------------------------------


def test_a_lone_submission_is_written_by_its_own_thread_in_a_group_of_one(deployed: Stack) -> None:
    d = deployed.connect()
    store = HeldStore(d.store, hold=False)
    try:
        submitted = Client(dataclasses.replace(d, store=store)).submit(spec("lone"))
        assert submitted.created
        assert store.groups == [["lone"]]
        assert store.threads == [threading.current_thread()]
        assert read_back(deployed, ["lone"]) == {"lone"}
    finally:
        d.close()


def test_concurrent_submissions_share_a_commit_and_each_gets_its_own_job(
    held: tuple[Deployment, HeldStore], deployed: Stack
) -> None:
    d, store = held
    ids = [f"job_{i}" for i in range(6)]
    pool, futures = start_in_order(d, store, [lambda c, j=j: c.submit(spec(j)) for j in ids])
    store.release.set()
    results = [f.result(timeout=30) for f in futures]
    pool.shutdown()
    assert [r.job.job_id for r in results] == ids
    assert all(r.created for r in results)
    assert store.groups == [ids[:1], ids[1:]]  # the ones that waited went in together, in arrival order
    assert read_back(deployed, ids) == set(ids)
    for job_id in ids:  # each job's instant run was stored with it, dispatched at submission
        [run] = runs_of(d, job_id)
        assert run.state is RunState.DISPATCHED


def runs_of(d: Deployment, job_id: str) -> list[Any]:
    return d.store.list_runs(RunQuery(job=JobKey("default", job_id))).items


def test_one_failing_submission_in_a_group_fails_alone_and_the_others_commit(
    held: tuple[Deployment, HeldStore], deployed: Stack
) -> None:
    d, store = held
    other = deployed.connect()
    Client(other).submit(spec("taken"))
    other.close()
    calls = [lambda c, j=j: c.submit(spec(j)) for j in ("first", "ok_1", "taken", "ok_2")]
    pool, futures = start_in_order(d, store, calls)
    store.release.set()
    with pytest.raises(DuplicateJob):
        futures[2].result(timeout=30)
    assert [futures[i].result(timeout=30).created for i in (0, 1, 3)] == [True, True, True]
    pool.shutdown()
    assert store.groups[1] == ["ok_1", "taken", "ok_2"]
    assert read_back(deployed, ["first", "ok_1", "ok_2"]) == {"first", "ok_1", "ok_2"}
    assert len(runs_of(d, "taken")) == 1  # the existing job's own run; the refused one wrote none


def test_two_submissions_of_one_job_id_in_a_group_the_first_to_arrive_creates_it(
    held: tuple[Deployment, HeldStore], deployed: Stack
) -> None:
    d, store = held
    calls = [
        lambda c: c.submit(spec("first")),
        lambda c: c.submit(spec("same", job_name="earlier")),
        lambda c: c.submit(spec("same", job_name="later")),
    ]
    pool, futures = start_in_order(d, store, calls)
    store.release.set()
    assert futures[1].result(timeout=30).created
    with pytest.raises(DuplicateJob):
        futures[2].result(timeout=30)
    pool.shutdown()
    assert d.store.get_jobs([JobKey("default", "same")])[JobKey("default", "same")].name == "earlier"


def test_idempotency_keys_inside_a_group_behave_as_when_serial(
    held: tuple[Deployment, HeldStore], deployed: Stack
) -> None:
    d, store = held
    calls = [
        lambda c: c.submit(spec("first")),
        lambda c: c.submit(spec("keyed", job_name="a"), idempotency_key="k-1"),
        lambda c: c.submit(spec("keyed", job_name="a"), idempotency_key="k-1"),  # the same request again
        lambda c: c.submit(spec("other", job_name="b"), idempotency_key="k-1"),  # the key with another body
        lambda c: c.submit(spec("plain")),
    ]
    pool, futures = start_in_order(d, store, calls)
    store.release.set()
    created, replayed = futures[1].result(timeout=30), futures[2].result(timeout=30)
    assert created.created and not replayed.created
    assert replayed.job.job_id == "keyed"
    with pytest.raises(IdempotencyConflict):
        futures[3].result(timeout=30)
    assert futures[4].result(timeout=30).created
    pool.shutdown()
    assert len(store.groups) == 2 and len(store.groups[1]) == 4
    assert read_back(deployed, ["keyed", "other", "plain"]) == {"keyed", "plain"}
    assert len(runs_of(d, "keyed")) == 1


def test_with_group_commit_off_every_submission_is_its_own_transaction(deployed: Stack) -> None:
    d = connect(Settings.load({**deployed.urls, "group_commit": "false"}, env={}))
    store = HeldStore(d.store, hold=False)
    try:
        assert Client(dataclasses.replace(d, store=store)).submit(spec("alone")).created
        assert store.groups == []  # create_job, not the group path
        assert read_back(deployed, ["alone"]) == {"alone"}
    finally:
        d.close()


# -- asyncio ----------------------------------------------------------------------------------------


def test_asubmit_waits_for_the_commit_without_blocking_the_event_loop(
    held: tuple[Deployment, HeldStore], deployed: Stack
) -> None:
    d, store = held
    client = Client(d)

    async def main() -> list[Submitted]:
        submissions = [asyncio.ensure_future(client.asubmit(spec(f"async_{i}"))) for i in range(8)]
        # The first commit is held: the loop still runs this coroutine, which then releases it.
        while not store.entered.is_set() or _group(store).waiting < 7:
            await asyncio.sleep(0.005)
        assert not any(s.done() for s in submissions)
        store.release.set()
        return await asyncio.gather(*submissions)

    results = asyncio.run(main())
    assert sorted(r.job.job_id for r in results) == sorted(f"async_{i}" for i in range(8))
    assert all(r.created for r in results)
    assert [len(g) for g in store.groups] == [1, 7]
    assert read_back(deployed, [f"async_{i}" for i in range(8)]) == {f"async_{i}" for i in range(8)}


def test_task_adelay_submits_from_asyncio_code(deployed: Stack) -> None:
    app = App("group-tests", settings=Settings.load({**deployed.urls, "history_flush_s": 0}, env={}))

    @app.task(name=TASK)
    def noop(x: int) -> None: ...

    async def main() -> list[Any]:
        return list(await asyncio.gather(*(noop.adelay(i) for i in range(5))))

    try:
        handles = asyncio.run(main())
        assert len({h.job_id for h in handles}) == 5
        assert read_back(deployed, [h.job_id for h in handles]) == {h.job_id for h in handles}
        scheduled = asyncio.run(noop.aschedule(delay_s=60, args=(1,)))
        assert scheduled.job.schedule.type.value == "ONE_OFF"
    finally:
        app.deployment.close()


def test_delay_validates_its_arguments_once_and_hashes_no_fingerprint_without_a_key(
    deployed: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Task.schedule` parses its arguments into a spec (to name them in errors); the client must
    not validate that spec again, and a fingerprint is only needed for an Idempotency-Key's record.
    Both were a fifth of a submission's CPU (docs/performance.md, "Submission")."""
    from jobq.submission import JobSpec

    app = App("group-tests", settings=Settings.load({**deployed.urls, "history_flush_s": 0}, env={}))

    @app.task(name=TASK)
    def noop(x: int) -> None: ...

    validations: list[object] = []
    prints: list[object] = []
    validate, fingerprint = JobSpec.model_validate, JobSpec.fingerprint
    monkeypatch.setattr(
        JobSpec, "model_validate", classmethod(lambda cls, v, **k: validations.append(v) or validate(v, **k))
    )
    monkeypatch.setattr(JobSpec, "fingerprint", lambda self: prints.append(self) or fingerprint(self))
    try:
        handle = noop.delay(1)
        assert (len(validations), len(prints)) == (1, 0)
        keyed = noop.schedule(args=(2,), idempotency_key="k-1")
        assert (len(validations), len(prints)) == (2, 1)
        again = noop.schedule(args=(2,), idempotency_key="k-1")  # a replay still compares fingerprints
        assert again.job_id == keyed.job_id
        assert read_back(deployed, [handle.job_id, keyed.job_id]) == {handle.job_id, keyed.job_id}
    finally:
        app.deployment.close()
