"""A cron schedule's next fires, marking those a DST rule moved, and the wall times it dropped.

The fires are `CronSchedule.fire_times`, the very function beat uses, so the preview cannot
disagree with what will run. The marks explain them after the fact:

* `shifted`: a fixed-time job with `dst_gap=shift` fires at the first instant after a
  spring-forward gap, standing for the wall times in the gap (`wall_times`).
* `second_pass`: a fire in the second pass of a repeated (fall-back) hour: wildcard jobs, or
  `dst_overlap=twice`.
* `skipped` events (not fires): wall times that matched but never fire, because they fell in a
  gap (`dst: gap`) or were the second pass of a fixed-time job under `dst_overlap=once`
  (`dst: repeat`). One event per transition; `wall_times` lists the first few.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from jobq.crondialect import parse_cron
from jobq.errors import ScheduleError
from jobq.models import DstGap, DstOverlap
from jobq.schedules import CronSchedule, Transition, to_iso, transitions_between
from jobq.submission import JOB_ID_PATTERN, parse_instant

MAX_FIRES = 500
HORIZON_MS = 10 * 366 * 86_400_000  # a preview stops 10 years after its start (a leap-day job fires 2-3 times)
LATEST_AFTER_MS = 221_845_392_000_000  # 9000-01-01: the horizon stays inside what datetime can show
_WALL_LIMIT = 1000  # wall times counted per transition (a per-second job has 3,600 in a 1 h gap)
_WALLS_SHOWN = 5
_EPOCH = datetime(1970, 1, 1)


@dataclass(frozen=True, slots=True)
class PreviewEvent:
    kind: Literal["fire", "skipped"]
    at_ms: int  # a fire's instant; a skipped event's transition instant
    dst: Literal["shifted", "second_pass", "gap", "repeat"] | None = None
    reason: str | None = None
    wall_times: tuple[int, ...] = field(default_factory=tuple)  # naive wall ms the event stands for
    wall_time_count: int = 0  # how many (up to _WALL_LIMIT; wall_times shows the first few)

    def resource(self, schedule: CronSchedule) -> dict[str, Any]:
        """The event as JSON: the same for `jobq cron --json` and `POST /v1/schedules:preview`."""
        local = datetime.fromtimestamp(self.at_ms / 1000, schedule.tz)
        return {
            "kind": self.kind,
            "epoch_ms": self.at_ms,
            "utc": to_iso(self.at_ms),
            "local": local.isoformat(timespec="seconds"),
            "zone": local.tzname(),
            "dst": self.dst,
            "reason": self.reason,
            "wall_times": [_wall_text(w, schedule) for w in self.wall_times],
            "wall_time_count": self.wall_time_count,
        }


class PreviewSpec(BaseModel):
    """What to preview: the body of `POST /v1/schedules:preview`, and `jobq cron`'s options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cron_expression: str = Field(min_length=1, max_length=200)
    timezone: str = Field(default="UTC", max_length=64)
    cron_dialect: str = "unix"
    dst_gap: DstGap = DstGap.SKIP
    dst_overlap: DstOverlap = DstOverlap.ONCE
    count: int = Field(default=10, ge=1, le=MAX_FIRES, description="How many fires to show.")
    after: int | str | None = Field(
        default=None, description="Start strictly after this instant: epoch ms or ISO 8601 (naive: in timezone). Now."
    )
    job_id: str | None = Field(
        default=None,
        pattern=JOB_ID_PATTERN,
        description="The job id `H` picks its values from (required when the expression uses `H`).",
    )


def preview_document(spec: PreviewSpec, now_ms: int) -> dict[str, Any]:
    """Validate `spec` and preview it: the JSON shared by the API and `jobq cron --json`.

    Raises `InvalidCron`, `UnknownTimezone` or `ScheduleError` (a bad `after`)."""
    parsed = parse_cron(spec.cron_expression, spec.cron_dialect, job_id=spec.job_id)
    schedule = CronSchedule(parsed.expression, spec.timezone, dst_gap=spec.dst_gap, dst_overlap=spec.dst_overlap)
    after_ms = now_ms if spec.after is None else parse_instant(spec.after, spec.timezone, field="after")
    if after_ms > LATEST_AFTER_MS:
        raise ScheduleError(f"after {spec.after!r} is beyond the year 9000", field="after")
    return document(schedule, parsed.source, after_ms, spec.count, job_id=spec.job_id)


def document(
    schedule: CronSchedule, source: str, after_ms: int, count: int, *, job_id: str | None = None
) -> dict[str, Any]:
    """A schedule's preview as JSON (`events` in time order, fires and skipped wall times)."""
    return {
        "cron_expression": schedule.expression,
        "cron_source": source,
        "timezone": schedule.tz.key,
        "dst_gap": schedule.dst_gap.value,
        "dst_overlap": schedule.dst_overlap.value,
        "job_id": job_id,
        "after": to_iso(after_ms),
        "events": [event.resource(schedule) for event in preview(schedule, after_ms, count)],
    }


def preview(schedule: CronSchedule, after_ms: int, count: int) -> list[PreviewEvent]:
    """The next `count` fires strictly after `after_ms` (within `HORIZON_MS`), with the DST
    events among them, in time order. Skipped events are reported up to the last fire shown."""
    fires: list[int] = []
    for ms in schedule.iter_after(after_ms):
        if ms > after_ms + HORIZON_MS or len(fires) >= min(count, MAX_FIRES):
            break
        fires.append(ms)
    if not fires:
        return []
    events = [_fire(schedule, ms) for ms in fires]
    for change in transitions_between(schedule.tz, after_ms, fires[-1]):
        skipped = _skipped(schedule, change)
        if skipped is not None:
            events.append(skipped)
    # A skipped event sorts before a fire at the same instant: the gap comes before what follows it.
    events.sort(key=lambda e: (e.at_ms, e.kind == "fire"))
    return events


def _fire(schedule: CronSchedule, at_ms: int) -> PreviewEvent:
    tz = schedule.tz
    local = datetime.fromtimestamp(at_ms / 1000, tz)
    before, after = _offset_ms(tz, at_ms - 1), _offset_ms(tz, at_ms)
    if after > before and not schedule.expr.wildcard and schedule.dst_gap is DstGap.SHIFT:
        walls = schedule.wall_matches(at_ms + before, at_ms + after, _WALL_LIMIT)
        if walls:
            return PreviewEvent(
                "fire",
                at_ms,
                "shifted",
                f"{_walls_phrase(walls, schedule)} did not happen ({_jump(at_ms, before, after)}); "
                "dst_gap=shift fires once, at the first instant after the gap",
                tuple(walls[:_WALLS_SHOWN]),
                len(walls),
            )
    if local.fold == 1:
        first, second = _fold_offsets(local)
        change = _clock_change(tz, at_ms, first, second)
        why = (
            "a wildcard job fires at every real instant whose wall time matches"
            if schedule.expr.wildcard
            else "dst_overlap=twice fires at both occurrences"
        )
        return PreviewEvent("fire", at_ms, "second_pass", f"second pass of a repeated hour ({change}); {why}")
    return PreviewEvent("fire", at_ms)


def _skipped(schedule: CronSchedule, change: Transition) -> PreviewEvent | None:
    at, before, after = change.at_ms, change.before_ms, change.after_ms
    if after > before:  # spring forward: wall times [at + before, at + after) never happen
        if not schedule.expr.wildcard and schedule.dst_gap is DstGap.SHIFT:
            return None  # the fire at `at` stands for them (marked `shifted`)
        walls = schedule.wall_matches(at + before, at + after, _WALL_LIMIT)
        if not walls:
            return None
        them = "it" if len(walls) == 1 else "them"
        why = (
            "a wildcard job has no fires in a gap"
            if schedule.expr.wildcard
            else f"dst_gap=skip drops {them} (dst_gap=shift would fire once, at the first instant after the gap)"
        )
        text = f"{_walls_phrase(walls, schedule)} did not happen ({_jump(at, before, after)}); {why}"
        return PreviewEvent("skipped", at, "gap", text, tuple(walls[:_WALLS_SHOWN]), len(walls))
    # Fall back: wall times [at + after, at + before) happen twice; the second pass starts at `at`.
    if schedule.expr.wildcard or schedule.dst_overlap is DstOverlap.TWICE:
        return None  # the second-pass fires are shown, marked `second_pass`
    walls = schedule.wall_matches(at + after, at + before, _WALL_LIMIT)
    if not walls:
        return None
    text = (
        f"{_walls_phrase(walls, schedule)} happened twice ({_jump(at, before, after)}); a fixed-time job fires "
        "once, at the first occurrence (dst_overlap=once; dst_overlap=twice would fire again)"
    )
    return PreviewEvent("skipped", at, "repeat", text, tuple(walls[:_WALLS_SHOWN]), len(walls))


def _offset_ms(tz: Any, instant_ms: int) -> int:
    offset = datetime.fromtimestamp(instant_ms / 1000, tz).utcoffset()
    assert offset is not None
    return offset // timedelta(milliseconds=1)


def _fold_offsets(local: datetime) -> tuple[int, int]:
    first, second = local.replace(fold=0).utcoffset(), local.replace(fold=1).utcoffset()
    assert first is not None and second is not None
    return first // timedelta(milliseconds=1), second // timedelta(milliseconds=1)


def _clock_change(tz: Any, at_ms: int, first_ms: int, second_ms: int) -> str:
    """`clocks went back from 02:00 to 01:00 on ...` for the fall-back behind a second-pass instant.

    The second pass lasts (first - second) ms from the transition, so the transition is in that window."""
    changes = transitions_between(tz, at_ms - (first_ms - second_ms) - 1, at_ms)
    change = changes[-1]
    return _jump(change.at_ms, change.before_ms, change.after_ms)


def _jump(at_ms: int, before_ms: int, after_ms: int) -> str:
    verb = "jumped forward" if after_ms > before_ms else "went back"
    old = (_EPOCH + timedelta(milliseconds=at_ms + before_ms)).strftime("%H:%M")
    new = (_EPOCH + timedelta(milliseconds=at_ms + after_ms)).strftime("%H:%M")
    day = (_EPOCH + timedelta(milliseconds=at_ms + after_ms)).date().isoformat()
    return f"clocks {verb} from {old} to {new} on {day}"


def _wall_text(wall_ms: int, schedule: CronSchedule) -> str:
    moment = _EPOCH + timedelta(milliseconds=wall_ms)
    return moment.isoformat(timespec="seconds" if schedule.expr.has_seconds else "minutes")


def _walls_phrase(walls: list[int], schedule: CronSchedule) -> str:
    fmt = "%H:%M:%S" if schedule.expr.has_seconds else "%H:%M"
    shown = [(_EPOCH + timedelta(milliseconds=w)).strftime(fmt) for w in walls[:_WALLS_SHOWN]]
    if len(walls) == 1:
        return f"wall time {shown[0]}"
    more = len(walls) - len(shown)
    tail = "" if more <= 0 else f" and {'at least ' if len(walls) >= _WALL_LIMIT else ''}{more} more"
    return f"wall times {', '.join(shown)}{tail}"
