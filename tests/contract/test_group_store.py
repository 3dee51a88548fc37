"""`JobStore.create_job_group`: requests written together, each with its own outcome, exactly as
if `create_job` had been called for each in turn. Every backend, against its real server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from factories import T0, key, make_job, make_run

from jobq.errors import DuplicateJob, IdempotencyConflict, StoreError
from jobq.ports import CreateRequest, CreateResult, JobStore

from .test_store import STORES, idem


@pytest.fixture(params=sorted(STORES))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobStore]:
    backend = STORES[request.param](tmp_path)
    yield backend
    backend.close()


def _req(job_id: str, **idempotency: str) -> CreateRequest:
    record = idem(job_id=job_id, **idempotency) if idempotency else None
    return CreateRequest(make_job(job_id, name=f"name of {job_id}"), [make_run(job_id)], record)


def test_every_request_of_a_group_is_written_with_its_runs_and_answered_in_order(store: JobStore) -> None:
    outcomes = store.create_job_group([_req(f"job_{i}") for i in range(5)])
    assert [o.job.job_id for o in outcomes if isinstance(o, CreateResult) and o.created] == [
        f"job_{i}" for i in range(5)
    ]
    assert set(store.get_jobs([key(f"job_{i}") for i in range(5)])) == {key(f"job_{i}") for i in range(5)}
    assert set(store.get_runs([f"job_{i}:{T0}" for i in range(5)])) == {f"job_{i}:{T0}" for i in range(5)}


def test_a_duplicate_in_a_group_fails_alone_and_the_others_commit(store: JobStore) -> None:
    store.create_job(make_job("job_1", name="first"), [])
    outcomes = store.create_job_group([_req("job_0"), _req("job_1"), _req("job_2")])
    assert isinstance(outcomes[1], DuplicateJob)
    assert all(isinstance(o, CreateResult) and o.created for o in (outcomes[0], outcomes[2]))
    assert store.get_jobs([key("job_1")])[key("job_1")].name == "first"
    assert store.get_runs([f"job_1:{T0}"]) == {}  # the refused request wrote no run
    assert set(store.get_jobs([key("job_0"), key("job_2")])) == {key("job_0"), key("job_2")}


def test_two_requests_for_one_job_id_in_a_group_create_it_once(store: JobStore) -> None:
    first, second = store.create_job_group([_req("job_1"), _req("job_1")])
    assert [isinstance(o, DuplicateJob) for o in (first, second)].count(True) == 1
    assert [isinstance(o, CreateResult) and o.created for o in (first, second)].count(True) == 1


def test_one_idempotency_key_twice_in_a_group_creates_one_job_and_replays_it(store: JobStore) -> None:
    first, second = store.create_job_group([_req("job_1", key="k"), _req("job_2", key="k")])
    assert isinstance(first, CreateResult) and isinstance(second, CreateResult)
    created, replayed = (first, second) if first.created else (second, first)
    assert created.created and not replayed.created
    assert replayed.job.job_id == created.job.job_id
    assert replayed.response == f'{{"job_id": "{created.job.job_id}"}}'
    other = "job_2" if created.job.job_id == "job_1" else "job_1"
    assert store.get_jobs([key(other)]) == {}
    assert store.get_runs([f"{other}:{T0}"]) == {}


def test_one_idempotency_key_with_two_bodies_in_a_group_is_a_conflict_for_one(store: JobStore) -> None:
    outcomes = store.create_job_group(
        [_req("job_1", key="k", fingerprint="f1"), _req("job_2", key="k", fingerprint="f2"), _req("job_3")]
    )
    assert [type(o) for o in outcomes].count(IdempotencyConflict) == 1
    assert sum(isinstance(o, CreateResult) and o.created for o in outcomes) == 2
    assert key("job_3") in store.get_jobs([key("job_3")])


def test_a_key_taken_before_the_group_is_replayed_inside_it(store: JobStore) -> None:
    store.create_job(make_job("job_1"), [], idem(job_id="job_1"))
    outcomes = store.create_job_group([_req("job_0"), _req("job_2", key="k1"), _req("job_3")])
    replay = outcomes[1]
    assert isinstance(replay, CreateResult) and not replay.created and replay.job.job_id == "job_1"
    assert store.get_jobs([key("job_2")]) == {}
    assert set(store.get_jobs([key("job_0"), key("job_3")])) == {key("job_0"), key("job_3")}


def test_a_keyed_request_for_a_job_id_that_exists_fails_alone_and_frees_its_key(store: JobStore) -> None:
    store.create_job(make_job("job_1"), [])
    outcomes = store.create_job_group([_req("job_1", key="k"), _req("job_2")])
    assert isinstance(outcomes[0], DuplicateJob)
    assert isinstance(outcomes[1], CreateResult) and outcomes[1].created
    # The duplicate's key was rolled back with it: the key is free for another job.
    assert store.create_job(make_job("job_3"), [], idem(key="k", job_id="job_3")).created


def test_an_empty_group_writes_nothing(store: JobStore) -> None:
    assert store.create_job_group([]) == []


def test_a_row_postgresql_refuses_fails_alone_and_the_others_commit(tmp_path: Path) -> None:
    """A job the server cannot store (NUL in text, which only a bug upstream could let through:
    submissions refuse it at the edge) aborts the group's transaction; each request is then
    written alone, so only the bad one fails."""
    store = STORES["postgres"](tmp_path)
    try:
        bad = make_job("job_bad").model_copy(update={"name": "nul\x00inside"})
        outcomes = store.create_job_group([_req("job_0"), CreateRequest(bad, [make_run("job_bad")]), _req("job_2")])
        assert isinstance(outcomes[1], StoreError) and not isinstance(outcomes[1], DuplicateJob)
        assert all(isinstance(o, CreateResult) and o.created for o in (outcomes[0], outcomes[2]))
        assert set(store.get_jobs([key("job_0"), key("job_bad"), key("job_2")])) == {key("job_0"), key("job_2")}
        assert store.get_runs([f"job_bad:{T0}"]) == {}
    finally:
        store.close()
