"""jobq's cron dialect: the grammar, its validator, and the deterministic `H`.

    expression := alias | fields                  fields: 5 (minute first) or 6 (second first)
    field      := item ("," item)*
    item       := "*" ["/" step]
                | value ["-" value] ["/" step]    a <= b; "a-a" is {a}; "a/n" is "a-<max>/n"
                | "H" ["(" value "-" value ")"] ["/" step]   resolved from the job id
                | "L"                             day-of-month: the month's last day
                | weekday "#" n | weekday "L"      day-of-week: the n-th (1-5) / last such weekday
    value      := number | name                   names: JAN-DEC (month), SUN-SAT (day-of-week)

docs/scheduling.md has the full grammar and the reasons. What this module guarantees:

* Every expression jobq stores was accepted here, and is stored in a canonical form (upper case,
  single spaces, `a-a` as `a`, `a/n` as `a-<max>/n`, `H` replaced by the values it picked).
* croniter never reads the user's text. Each field is expanded here into explicit values and
  handed to croniter as plain lists (plus `L` and `#` items), so croniter's own reading of
  ranges, steps and wrap-arounds (`a-a` as the whole field, in every version so far) cannot
  decide a fire time; croniter only does the calendar arithmetic.
* `H` is a pure function of (job id, field, position): blake2b, not `hash()`, so every process
  and every Python version picks the same value.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime

from croniter import croniter
from croniter.croniter import CroniterBadDateError, CroniterError

from jobq.errors import InvalidCron

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
DIALECTS = ("unix",)
MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
DAY_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
_BLANKS = re.compile(r"[ \t\r\n]+")
_NUMBER = re.compile(r"[0-9]{1,4}")
_H_ITEM = re.compile(r"H(?:\((?P<a>[0-9A-Z]+)-(?P<b>[0-9A-Z]+)\))?(?:/(?P<step>[0-9]+))?")
_H_PERSON = b"jobq-cron-H"  # domain separation: these digests mean nothing anywhere else


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One position of an expression: its name, the numbers it accepts and its names."""

    name: str
    lo: int
    hi: int  # the largest number accepted (day-of-week: 7, Sunday again)
    top: int  # the last value of the cycle (day-of-week: 6)
    names: tuple[str, ...] = ()  # names[i] stands for lo + i
    h_hi: int | None = None  # plain `H` picks from lo..h_hi (day-of-month: 28, in every month)

    @property
    def size(self) -> int:
        return self.top - self.lo + 1

    def named(self, value: int) -> int:
        """Folds aliases of one value (day-of-week 7 is 0)."""
        return self.lo if value > self.top else value


SECOND = FieldSpec("second", 0, 59, 59)
MINUTE = FieldSpec("minute", 0, 59, 59)
HOUR = FieldSpec("hour", 0, 23, 23)
DAY_OF_MONTH = FieldSpec("day-of-month", 1, 31, 31, h_hi=28)
MONTH = FieldSpec("month", 1, 12, 12, MONTH_NAMES)
DAY_OF_WEEK = FieldSpec("day-of-week", 0, 7, 6, DAY_NAMES)
FIVE_FIELDS = (MINUTE, HOUR, DAY_OF_MONTH, MONTH, DAY_OF_WEEK)
SIX_FIELDS = (SECOND, *FIVE_FIELDS)


class _Refused(Exception):
    """A reason an expression is refused, in jobq's words, naming the field."""


@dataclass(frozen=True, slots=True)
class CronField:
    """One field as jobq reads it."""

    text: str  # canonical
    values: frozenset[int]
    last_day: bool = False  # day-of-month `L`
    nth: frozenset[tuple[int, int]] = field(default_factory=frozenset)  # (weekday, n): n 1-5, 0 = last

    @property
    def restricted(self) -> bool:
        """crontab(5): a field that starts with `*` is unrestricted (the day-OR and DST rules)."""
        return not self.text.startswith("*")

    def croniter_text(self) -> str:
        """The field as explicit values, the only form croniter is given."""
        if self.text == "*":
            return "*"
        parts = [str(v) for v in sorted(self.values)]
        if self.last_day:
            parts.append("L")
        parts.extend(f"{day}#{n}" if n else f"L{day}" for day, n in sorted(self.nth))
        return ",".join(parts)


@dataclass(frozen=True, slots=True)
class CronExpr:
    """An accepted expression."""

    expression: str  # canonical: what is stored and shown as `cron_expression`
    has_seconds: bool  # six fields, seconds first
    wildcard: bool  # minute or hour field starts with '*': fires in both passes of a repeat
    day_or: bool = True  # crontab(5): both day fields restricted (neither starts with '*') -> either matches
    croniter_expression: str = ""  # explicit values: what croniter iterates
    source: str = ""  # as submitted (whitespace collapsed), before aliases and `H` were resolved


def parse_cron(expression: str, dialect: str = "unix", *, job_id: str | None = None) -> CronExpr:
    """Validate `expression` against jobq's dialect and return its canonical form.

    `job_id` seeds `H`; an expression with `H` and no job id is refused (its values are not
    known yet). Raises `InvalidCron` naming the field and the reason; never a croniter error."""
    if dialect not in DIALECTS:
        raise InvalidCron(f"unknown cron_dialect {dialect!r}; supported: {', '.join(DIALECTS)}", field="cron_dialect")
    source = " ".join(_BLANKS.split(expression.strip(" \t\r\n")))
    if not source:
        raise InvalidCron("empty cron expression", field="cron_expression")
    try:
        return _parse(source, job_id)
    except _Refused as exc:
        raise InvalidCron(f"invalid cron expression {expression!r}: {exc}", field="cron_expression") from None


def _parse(source: str, job_id: str | None) -> CronExpr:
    if not source.isascii():
        raise _Refused("only ASCII letters, digits and * , - / # ( ) are allowed")
    text = source
    if text.startswith("@"):
        if text.lower() not in ALIASES:
            raise _Refused(f"unknown alias {text!r}; use one of {', '.join(sorted(ALIASES))}")
        text = ALIASES[text.lower()]
    words = text.upper().split(" ")
    if len(words) not in (5, 6):
        raise _Refused(
            f"it has {len(words)} fields; use 5 (minute hour day-of-month month day-of-week) "
            "or 6 (second minute hour day-of-month month day-of-week)"
        )
    specs = SIX_FIELDS if len(words) == 6 else FIVE_FIELDS
    fields = [_field(spec, word, job_id) for spec, word in zip(specs, words, strict=True)]
    dom, dow = fields[-3], fields[-1]
    if dow.nth and dom.text != "*":
        raise _Refused(
            f"day-of-week field: {dow.text} (a weekday of the month) cannot be combined with day-of-month "
            f"{dom.text}; set day-of-month to *"
        )
    canonical = " ".join(f.text for f in fields)
    day_or = dom.restricted and dow.restricted
    minute, hour = fields[-5], fields[-4]
    expr = CronExpr(
        expression=canonical,
        has_seconds=len(fields) == 6,
        wildcard=not (minute.restricted and hour.restricted),
        day_or=day_or,
        croniter_expression=" ".join(f.croniter_text() for f in fields),
        source=source,
    )
    _check_fires(expr)
    return expr


def _check_fires(expr: CronExpr) -> None:
    try:
        it = croniter(
            expr.croniter_expression, datetime(2026, 1, 1), day_or=expr.day_or, second_at_beginning=expr.has_seconds
        )
        it.get_next(datetime)
    except CroniterBadDateError:
        raise _Refused("it never fires (no date matches its day and month fields)") from None
    except (CroniterError, ValueError, KeyError, IndexError, TypeError) as exc:  # pragma: no cover - a bug
        # Everything was validated above: croniter refusing the explicit form is jobq's bug.
        raise _Refused(f"croniter refused jobq's expansion {expr.croniter_expression!r}: {exc}") from None


def _field(spec: FieldSpec, word: str, job_id: str | None) -> CronField:
    texts: list[str] = []
    values: set[int] = set()
    last_day = False
    nth: set[tuple[int, int]] = set()
    for index, raw in enumerate(word.split(",")):
        item = _resolve_h(spec, raw, index, job_id) if raw.startswith("H") else raw
        text, item_values, item_last, item_nth = _item(spec, item)
        texts.append(text)
        values |= item_values
        last_day = last_day or item_last
        nth |= item_nth
    if nth and values:
        raise _Refused(
            f"{spec.name} field: {word} mixes plain weekdays with #/L weekdays of the month; use one kind per field"
        )
    return CronField(",".join(texts), frozenset(values), last_day, frozenset(nth))


def _item(spec: FieldSpec, raw: str) -> tuple[str, set[int], bool, set[tuple[int, int]]]:
    """(canonical text, values, last day of month, nth weekdays) of one list item."""
    where = f"{spec.name} field"
    if not raw:
        raise _Refused(f"{where}: empty list item (two commas in a row, or one at an end)")
    if "?" in raw:
        raise _Refused(
            f"{where}: ? is Quartz/EventBridge syntax, not jobq's; write * (and mind that those tools number "
            "weekdays 1-7 from Sunday, while jobq, like crontab, uses 0-7 with 0 and 7 for Sunday)"
        )
    if raw.startswith("R"):
        raise _Refused(
            f"{where}: R (a random value) is refused: every process would draw its own, so fire times would "
            "differ between them; use H, which picks a stable value from the job id"
        )
    body, slash, step_text = raw.partition("/")
    step = _step(spec, step_text) if slash else None
    if body == "*":
        return raw, {spec.named(v) for v in range(spec.lo, spec.top + 1, step or 1)}, False, set()
    if spec is DAY_OF_MONTH and ("W" in body or body.startswith("L")):
        if "W" in body:
            raise _Refused(f"{where}: W (nearest weekday) is not supported; list the days, or use L for the last day")
        if body != "L":
            raise _Refused(f"{where}: {body} is not supported; L alone is the month's last day")
        if slash:
            raise _Refused(f"{where}: L takes no step")
        return "L", set(), True, set()
    if spec is DAY_OF_WEEK and ("#" in body or (body.endswith("L") and len(body) > 1)):
        if slash:
            raise _Refused(f"{where}: {body} takes no step")
        return _weekday_of_month(body)
    if "#" in body or "L" in _words(body) or "W" in _words(body):
        raise _Refused(
            f"{where}: {raw} is not allowed here; L is for day-of-month (the last day) and day-of-week "
            "(5L: the last Friday), # for day-of-week (MON#1: the first Monday), and W is not supported"
        )
    if body.startswith("H"):
        raise _Refused(f"{where}: {raw} is not a valid H; write H, H(a-b), H/n or H(a-b)/n")
    parts = body.split("-")
    if len(parts) > 2:
        raise _Refused(f"{where}: {body} is not a range; a range is a-b")
    a = _value(spec, parts[0])
    b = _value(spec, parts[1]) if len(parts) == 2 else None
    if b is None and step is None:
        return parts[0], {spec.named(a)}, False, set()
    if b is None:  # `a/n`: from a to the end of the field, as Quartz reads it
        top_text = spec.names[spec.top - spec.lo] if spec.names and not _NUMBER.fullmatch(parts[0]) else str(spec.top)
        b, body = spec.top, f"{parts[0]}-{top_text}"
        if a > b:  # day-of-week 7/n
            raise _Refused(f"{where}: {raw} starts after the end of the week; use 0 for Sunday")
    if a > b:
        low = spec.names[0] if spec.names and not _NUMBER.fullmatch(parts[0]) else str(spec.lo)
        high = spec.names[-1] if spec.names and not _NUMBER.fullmatch(parts[0]) else str(spec.top)
        raise _Refused(
            f"{where}: range {body} runs backwards ({a} > {b}); jobq does not wrap ranges around, "
            f"write it as {parts[0]}-{high},{low}-{parts[1]}"
        )
    if a == b:  # crontab(5): `a-a` is the single value a (croniter reads it as the whole field)
        return parts[0], {spec.named(a)}, False, set()
    text = f"{body}/{step}" if step is not None else body
    return text, {spec.named(v) for v in range(a, b + 1, step or 1)}, False, set()


def _words(body: str) -> str:
    """`body` without its names, so a name's letters (JUL, WED) are not read as L or W."""
    names = "|".join(MONTH_NAMES + DAY_NAMES)
    return re.sub(names, "", body)


def _weekday_of_month(body: str) -> tuple[str, set[int], bool, set[tuple[int, int]]]:
    where = f"{DAY_OF_WEEK.name} field"
    if "#" in body:
        day_text, _, n_text = body.partition("#")
        if not re.fullmatch(r"[1-5]", n_text):
            raise _Refused(f"{where}: {body}: the number after # is the week of the month, 1-5")
        day, n = _value(DAY_OF_WEEK, day_text), int(n_text)
    else:
        day_text, n = body[:-1], 0
        day = _value(DAY_OF_WEEK, day_text)
    return body, set(), False, {(DAY_OF_WEEK.named(day), n)}


def _value(spec: FieldSpec, token: str) -> int:
    where = f"{spec.name} field"
    if _NUMBER.fullmatch(token):
        value = int(token)
        if not spec.lo <= value <= spec.hi:
            raise _Refused(f"{where}: {value} is out of range {spec.lo}-{spec.hi}")
        return value
    if token in spec.names:
        return spec.lo + spec.names.index(token)
    if spec.names:
        raise _Refused(f"{where}: {token!r} is not a number or a name ({spec.names[0]}-{spec.names[-1]})")
    if not token:
        raise _Refused(f"{where}: a range needs a number on both sides of '-' (negative numbers do not exist here)")
    raise _Refused(f"{where}: {token!r} is not a number")


def _step(spec: FieldSpec, text: str) -> int:
    where = f"{spec.name} field"
    if not _NUMBER.fullmatch(text):
        raise _Refused(f"{where}: step {text!r} is not a number")
    step = int(text)
    if step < 1:
        raise _Refused(f"{where}: step {step} must be at least 1")
    if step > spec.size:
        raise _Refused(f"{where}: step {step} is larger than the field ({spec.lo}-{spec.top}, {spec.size} values)")
    return step


def h_value(job_id: str, field_name: str, index: int, modulus: int) -> int:
    """A value in [0, modulus) picked by the job id for one `H` item: the same in every process."""
    key = f"{job_id}\x00{field_name}\x00{index}".encode()
    digest = hashlib.blake2b(key, digest_size=8, person=_H_PERSON).digest()
    return int.from_bytes(digest, "big") % modulus


def _resolve_h(spec: FieldSpec, raw: str, index: int, job_id: str | None) -> str:
    """`H`, `H(a-b)`, `H/n`, `H(a-b)/n` as the plain item they stand for, for this job."""
    where = f"{spec.name} field"
    match = _H_ITEM.fullmatch(raw)
    if match is None:
        raise _Refused(f"{where}: {raw} is not a valid H; write H, H(a-b), H/n or H(a-b)/n")
    if match["a"] is not None:
        lo, hi = _value(spec, match["a"]), _value(spec, match["b"])
        if lo > hi:
            raise _Refused(f"{where}: {raw}: the range of H runs backwards ({lo} > {hi})")
    else:
        lo = spec.lo
        hi = spec.top if match["step"] is not None else (spec.h_hi or spec.top)
    step = _step(spec, match["step"]) if match["step"] is not None else None
    if job_id is None:
        raise _Refused(
            f"{where}: H picks its value from the job's id, and there is none here; submit it as a job, "
            "or give the job id to preview it (job_id, --job-id)"
        )
    if step is None:
        return str(lo + h_value(job_id, spec.name, index, hi - lo + 1))
    start = lo + h_value(job_id, spec.name, index, min(step, hi - lo + 1))
    return f"{start}-{hi}/{step}"
