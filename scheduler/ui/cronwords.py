"""A canonical cron expression in words, for people: "at 02:00 on day 1 of the month".

Covers the common shapes (fixed times, steps, lists and ranges, weekdays, months); anything else
is spelled field by field. The expression itself is always shown beside the words.
"""

from __future__ import annotations

_DAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = ("", "January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December")  # fmt: skip


def _number(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _items(field: str, names: tuple[str, ...] | None = None) -> str:
    """`1-5` -> "1 to 5", `1,3` -> "1 and 3", with names where given."""

    def one(part: str) -> str:
        if "-" in part:
            low, high = part.split("-", 1)
            return f"{one(low)} to {one(high)}"
        n = _number(part)
        return names[n] if names is not None and n is not None and n < len(names) else part

    parts = [one(p) for p in field.split(",")]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _time(second: str, minute: str, hour: str) -> str:
    s, m, h = _number(second), _number(minute), _number(hour)
    if s is not None and m is not None and h is not None:
        return f"at {h:02d}:{m:02d}" + (f":{s:02d}" if s else "")
    if second not in ("0", "*") and minute == "*" and hour == "*":
        if second.startswith("*/"):
            return f"every {second[2:]} seconds"
        return f"at second {_items(second)} of every minute"
    if minute == "*" and hour == "*":
        return "every second" if second == "*" else "every minute"
    if minute.startswith("*/") and hour == "*":
        return f"every {minute[2:]} minutes"
    if m is not None and hour == "*":
        return "every hour, on the hour" if m == 0 else f"at minute {m} of every hour"
    if m is not None and hour.startswith("*/"):
        return f"at minute {m} of every {hour[2:]}th hour"
    if m is not None:
        return f"at minute {m} past hour {_items(hour)}"
    return f"at minute {_items(minute)} of hour {_items(hour) if hour != '*' else 'every hour'}"


def _days(day_of_month: str, month: str, day_of_week: str) -> str:
    words = []
    if day_of_month != "*" and day_of_week != "*":
        words.append(f"on day {_items(day_of_month)} of the month or on {_items(day_of_week, _DAYS)}")
    elif day_of_month != "*":
        words.append(f"on day {_items(day_of_month)} of the month")
    elif day_of_week != "*":
        words.append(f"on {_items(day_of_week, _DAYS)}")
    else:
        words.append("every day")
    if month != "*":
        words.append(f"in {_items(month, _MONTHS)}")
    return " ".join(words)


def in_words(expression: str, timezone: str = "UTC") -> str:
    """A 5-field (minute first) or 6-field (seconds first) canonical expression in words."""
    fields = expression.split()
    if len(fields) == 5:
        fields = ["0", *fields]
    if len(fields) != 6 or any(f.upper() != f.lower() and f.upper() in ("L", "W") for f in fields):
        return expression
    second, minute, hour, dom, month, dow = fields
    when, days = _time(second, minute, hour), _days(dom, month, dow)
    if days == "every day" and when.startswith("every"):
        return f"{when} ({timezone})"
    return f"{when} {days} ({timezone})"
