"""Specs for the process-local metrics: a histogram's buckets are cumulative when read, whether its
values were observed one by one or in a batch; a worker observes every run it starts (in one call
per start batch and tier)."""

from __future__ import annotations

from pathlib import Path

from harness import Harness
from hypothesis import given
from hypothesis import strategies as st

from jobq.app import Task
from jobq.clock import ManualClock
from jobq.metrics import METRICS, Histogram

_values = st.lists(st.floats(min_value=0, max_value=1_000, allow_nan=False), max_size=30)


def test_a_histogram_reads_as_cumulative_buckets_with_the_count_and_the_sum() -> None:
    h = Histogram("jobq_x_seconds", "x", ("priority",))
    for value in (0.001, 0.02, 0.02, 400.0):
        h.observe(value, priority="HIGH")

    data = h.snapshot()[("HIGH",)]

    buckets = dict(zip(Histogram.BUCKETS, data, strict=False))
    assert buckets[0.005] == 1
    assert buckets[0.01] == 1
    assert buckets[0.025] == 3
    assert buckets[300.0] == 3  # 400 s lies beyond the last bound: only +Inf (the count) holds it
    assert data[-2:] == [4, 0.001 + 0.02 + 0.02 + 400.0]
    assert h.count(priority="HIGH") == 4


def test_a_value_on_a_bound_falls_in_that_bound_s_bucket() -> None:
    h = Histogram("jobq_x_seconds", "x")
    h.observe(0.005)

    assert h.snapshot()[()][0] == 1


def test_the_exposition_shows_cumulative_buckets_and_inf_equal_to_the_count() -> None:
    h = Histogram("jobq_x_seconds", "x", ("priority",))
    h.observe_many([0.003, 0.2, 2.0, 500.0], priority="LOW")

    lines = list(h.render())

    assert 'jobq_x_seconds_bucket{priority="LOW",le="0.005"} 1' in lines
    assert 'jobq_x_seconds_bucket{priority="LOW",le="0.25"} 2' in lines
    assert 'jobq_x_seconds_bucket{priority="LOW",le="300"} 3' in lines
    assert 'jobq_x_seconds_bucket{priority="LOW",le="+Inf"} 4' in lines
    assert 'jobq_x_seconds_count{priority="LOW"} 4' in lines


@given(_values, _values)
def test_observing_a_batch_reads_the_same_as_observing_its_values_one_by_one(
    first: list[float], second: list[float]
) -> None:
    one_by_one = Histogram("jobq_x_seconds", "x", ("priority",))
    batched = Histogram("jobq_x_seconds", "x", ("priority",))
    for value in first + second:
        one_by_one.observe(value, priority="HIGH")
    batched.observe_many(first, priority="HIGH")
    batched.observe_many(second, priority="HIGH")

    expected = one_by_one.snapshot()
    got = batched.snapshot()
    assert got.keys() == expected.keys()
    for key in expected:
        assert got[key][:-1] == expected[key][:-1]
        assert abs(got[key][-1] - expected[key][-1]) < 1e-6


def test_a_worker_observes_the_start_lateness_of_every_run_it_starts_under_its_tier(
    tmp_path: Path, clock: ManualClock
) -> None:
    h = Harness("memory", tmp_path, clock)
    try:
        h.app.task(name="t.noop")(lambda: None)
        definition = h.app.registry.get("t.noop")
        assert definition is not None
        task = Task(h.app, definition)
        before = {
            p: METRICS.start_lateness.snapshot().get((p,), [0.0] * (len(Histogram.BUCKETS) + 2))
            for p in ("HIGH", "LOW")
        }
        for priority in ("HIGH", "HIGH", "LOW"):
            task.schedule(priority=priority)
        h.dispatch()
        h.advance(2)  # every run starts 2 s after it was due
        worker = h.worker(concurrency=8)

        assert h.work(worker) == 3

        after = METRICS.start_lateness.snapshot()
        index = Histogram.BUCKETS.index(2.5)  # the first bound at or above 2 s
        for priority, started in (("HIGH", 2), ("LOW", 1)):
            grown = [a - b for a, b in zip(after[(priority,)], before[priority], strict=True)]
            assert grown[-2] == started
            assert grown[index - 1] == 0 and grown[index] == started
            assert abs(grown[-1] - 2.0 * started) < 1e-9
        assert worker.state.take_lateness() == 2_000
    finally:
        h.close()
