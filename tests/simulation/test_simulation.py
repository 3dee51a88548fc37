"""The simulation's fixed budget in CI: many seeds, each thousands of interleaved steps, no violation.

`pytest tests/simulation --seed N` replays one seed (and prints its shrunk trace if it fails);
`python -m tests.simulation --seeds 100000` searches on."""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

import pytest

from simulation.runner import describe, run_seed, seed_holds, shrink

SEEDS = 160  # the CI budget: SEEDS x STEPS interleaved actions, spread over a process per core
STEPS = 2000
SQLITE_EVERY = 5  # one seed in five runs on the SQLite backends, the others in memory
PARALLEL_FROM = 16  # fewer seeds than this (a replay, the fast subset) run in this process


def _seeds(config: pytest.Config) -> list[int]:
    chosen = config.getoption("--seed")
    return [chosen] if chosen is not None else list(range(SEEDS))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "seed" in metafunc.fixturenames:
        metafunc.parametrize("seed", _seeds(metafunc.config))


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logging.disable(logging.CRITICAL)  # thousands of daemon passes: their logs only slow the search
    yield
    logging.disable(logging.NOTSET)


def _backend(seed: int) -> str:
    return "sqlite" if seed % SQLITE_EVERY == SQLITE_EVERY - 1 else "memory"


@pytest.fixture(scope="module")
def verdicts(request: pytest.FixtureRequest) -> dict[int, bool]:
    """Every seed of this session run up front on a process per core (the seeds are independent and
    CPU-bound: half the wall time on two cores); each test then reports its own seed. Processes are
    spawned, not forked, so none inherits a lock another thread of pytest held."""
    seeds = [
        item.callspec.params["seed"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_no_seed_breaks_a_guarantee"
    ]
    if len(seeds) < PARALLEL_FROM:
        return {}
    steps = request.config.getoption("--sim-steps") or STEPS
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1, mp_context=context) as pool:
        jobs = [(seed, steps, _backend(seed)) for seed in seeds]
        return dict(zip(seeds, pool.map(seed_holds, jobs, chunksize=4), strict=True))


@pytest.mark.timeout(900)  # the first seed's setup runs every seed in the pool
def test_no_seed_breaks_a_guarantee(seed: int, request: pytest.FixtureRequest, verdicts: dict[int, bool]) -> None:
    if verdicts.get(seed) is True:
        return  # run in the pool, where it broke nothing
    steps = request.config.getoption("--sim-steps") or STEPS
    result = run_seed(seed, steps, _backend(seed))  # here: to report (and shrink) what it broke
    if not result.ok:
        pytest.fail(describe(shrink(result, budget_s=30)), pytrace=False)
