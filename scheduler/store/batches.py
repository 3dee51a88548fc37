"""Splitting a batch of transitions into statements that each apply many runs at once.

An UPDATE that joins the runs table with a list of per-row values applies each listed run once,
and a store cannot say which of two rows naming one run it would use. So a batch goes out in
rounds: a run's n-th transition in the batch belongs to round n, and within a round the
transitions of one shape (the same SET and WHERE, differing only in values) are one statement.
Rounds run in order, so a run named twice keeps the order of its transitions.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from jobq.models import Transition


def shape(t: Transition) -> tuple[Any, ...]:
    """What one statement has in common for all its rows: every column it sets or compares."""
    return (
        t.expect,
        t.to_state,
        t.bump_fence,
        t.at_ms is None,
        tuple(sorted(t.changes)),
        t.expect_fence is None,
        t.expect_owner is None,
        t.expect_version is None,
        t.job_status,
    )


def transition_groups(transitions: Sequence[Transition]) -> list[list[int]]:
    """Indexes of `transitions` in groups that one statement can apply: the same shape, and each
    run at most once. A run's later transitions go to later rounds, so its order is kept."""
    return [list(group) for group in _rounds((t.run_id, shape(t)) for t in transitions)]


def key_rounds(keys: Sequence[Hashable]) -> list[list[int]]:
    """Indexes of `keys` in rounds in which each key appears at most once, in order."""
    return _rounds((key, None) for key in keys)


def _rounds(items: Iterable[tuple[Hashable, Hashable]]) -> list[list[int]]:
    rounds: list[dict[Hashable, list[int]]] = []
    seen: dict[Hashable, int] = {}
    for i, (key, kind) in enumerate(items):
        level = seen.get(key, -1) + 1
        seen[key] = level
        if level == len(rounds):
            rounds.append({})
        rounds[level].setdefault(kind, []).append(i)
    return [group for kinds in rounds for group in kinds.values()]
