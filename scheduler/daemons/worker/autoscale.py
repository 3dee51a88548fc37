"""Autoscaling: the pool size a worker should have, from the backlog of its queues, the start
lateness of its runs and how many of its slots are busy (`--autoscale MAX,MIN`).

The decision is a function of (signals, now): `Autoscaler.decide` keeps only the time of the last
change and how long the worker has looked idle, so the simulation and unit tests step it by hand.

- Grow, at once, when messages wait and at least `GROW_UTILISATION` of the slots are busy, or
  when runs start later than `LATE_S`: to the busy slots plus the backlog (enough to take every
  waiting message now), at least `GROW_FACTOR` times the current size, at most MAX. A grow may
  follow the last change after `GROW_COOLDOWN_S`.
- Shrink only when nothing waits and at most `SHRINK_UTILISATION` of the slots have been busy
  for `IDLE_FOR_S` on end, and `SHRINK_COOLDOWN_S` after the last change: to what is busy with
  headroom, at least MIN. The gap between the grow and shrink thresholds, the idle period and the
  cool-downs are the hysteresis that keeps a bursty queue from flapping.

`recommended_workers` is the figure for scaling whole workers (KEDA, ECS): every message of the
queues, waiting or in flight, over the slots one worker may have.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GROW_UTILISATION = 0.75
SHRINK_UTILISATION = 0.5
LATE_S = 1.0
GROW_FACTOR = 1.5
GROW_COOLDOWN_S = 1.0
SHRINK_COOLDOWN_S = 10.0
IDLE_FOR_S = 10.0
HEADROOM = 1.25


@dataclass(frozen=True)
class Signals:
    backlog: int  # messages waiting on the worker's queues
    busy: int  # slots holding an attempt (or lost to one)
    size: int  # the pool size now
    lateness_s: float = 0.0  # the largest start lateness since the last decision


@dataclass(frozen=True)
class Change:
    size: int
    reason: str


class Autoscaler:
    def __init__(self, maximum: int, minimum: int) -> None:
        if not 1 <= minimum <= maximum:
            raise ValueError(f"autoscale needs 1 <= MIN <= MAX, got {maximum},{minimum}")
        self.maximum = maximum
        self.minimum = minimum
        self._changed_ms: int | None = None
        self._idle_since_ms: int | None = None

    def decide(self, signals: Signals, now_ms: int) -> Change | None:
        """The new pool size, or None to keep it."""
        size = signals.size
        if size < self.minimum or size > self.maximum:  # bring a size set outside the bounds back
            return self._change(min(max(size, self.minimum), self.maximum), "outside MIN..MAX", now_ms)
        utilisation = signals.busy / size if size else 1.0
        since_change_s = math.inf if self._changed_ms is None else (now_ms - self._changed_ms) / 1000
        waiting = signals.backlog > 0
        if (waiting and utilisation >= GROW_UTILISATION) or (signals.lateness_s > LATE_S and utilisation >= 1.0):
            self._idle_since_ms = None
            want = max(signals.busy + signals.backlog, math.ceil(size * GROW_FACTOR))
            target = min(self.maximum, want)
            if target > size and since_change_s >= GROW_COOLDOWN_S:
                why = (
                    f"{signals.backlog} waiting, {signals.busy}/{size} busy, start lateness {signals.lateness_s:.1f} s"
                )
                return self._change(target, why, now_ms)
            return None
        if waiting or utilisation > SHRINK_UTILISATION:
            self._idle_since_ms = None
            return None
        if self._idle_since_ms is None:
            self._idle_since_ms = now_ms
        idle_s = (now_ms - self._idle_since_ms) / 1000
        target = max(self.minimum, math.ceil(signals.busy * HEADROOM))
        if target < size and idle_s >= IDLE_FOR_S and since_change_s >= SHRINK_COOLDOWN_S:
            return self._change(target, f"queues empty, {signals.busy}/{size} busy for {idle_s:.0f} s", now_ms)
        return None

    def _change(self, size: int, reason: str, now_ms: int) -> Change:
        self._changed_ms = now_ms
        self._idle_since_ms = None
        return Change(size, reason)


def recommended_workers(messages: int, slots_per_worker: int) -> int:
    """Workers needed to hold every message of the queues (waiting or in flight) at once; at least 1."""
    return max(1, math.ceil(messages / max(1, slots_per_worker)))
