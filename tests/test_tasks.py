"""Specs for what a running task can read: its context's `lease_lost` and `cancelled` flags."""

from __future__ import annotations

import threading

import pytest

from jobq.tasks import Flag, TaskContext


def fresh_context() -> TaskContext:
    return TaskContext("job_1:1000", "job_1", 1, 1, "t.task", "worker-a")


@pytest.mark.parametrize("name", ["lease_lost", "cancelled"])
def test_a_context_flag_is_false_on_a_fresh_context_and_true_once_set(name: str) -> None:
    ctx = fresh_context()
    flag: Flag = getattr(ctx, name)

    assert not flag  # `if ctx.lease_lost:` must not fire on a healthy run
    assert bool(flag) is False

    flag.set()

    assert flag
    assert bool(flag) is True
    assert ctx.should_stop


def test_a_cleared_flag_is_false_again() -> None:
    flag = Flag()
    flag.set()
    flag.clear()

    assert not flag


def test_a_flag_set_from_another_thread_is_true_for_the_task_thread_and_wakes_its_wait() -> None:
    ctx = fresh_context()
    seen: list[tuple[bool, bool]] = []

    def task() -> None:
        woke = ctx.cancelled.wait(5)
        seen.append((woke, bool(ctx.cancelled)))

    thread = threading.Thread(target=task)
    thread.start()
    ctx.cancelled.set()
    thread.join(5)

    assert seen == [(True, True)]
    assert not ctx.lease_lost


def test_a_flag_shows_its_state_in_its_repr() -> None:
    flag = Flag()
    assert repr(flag) == "Flag(clear)"
    flag.set()
    assert repr(flag) == "Flag(set)"
