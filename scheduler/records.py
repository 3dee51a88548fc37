"""Decoding records read back from a store, one at a time: a record that does not decode is a
*corrupt marker*, never an exception that fails the whole read.

A row may have been written by an older version, by hand, or by a bug (a job document with
``"max_retries": -1``). Stores decode every row through `decode_job` / `decode_run` (or catch
`DECODE_ERRORS` around their own conversion and call `corrupt_job` / `corrupt_run`). A row that
does not decode comes back as a `Job` or `Run` whose `corrupt` names the first problem, carrying:

- the row's plain columns that are valid on their own (ids, tenant, name, status, state, fence,
  version, lease, times): these are what the narrow writes of a quarantine compare and set;
- every other field of the document that is valid on its own (a bad retry policy leaves the
  schedule, target and payload readable);
- placeholders for the rest: task `jobq.corrupt`, a `ONE_OFF` schedule with no time, times 0.

A marker is for showing and for taking out of circulation (see `jobq.daemons.quarantine`): it is
never rewritten as a whole (`update_job` refuses one) and never materialised or dispatched.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from functools import cache
from typing import Annotated, Any, TypeVar

from pydantic import TypeAdapter, ValidationError

from jobq.models import (
    PRIORITIES_BY_RANK,
    Job,
    Priority,
    Run,
    RunEvent,
    RunState,
    Schedule,
    ScheduleType,
    TaskInfo,
    TaskTarget,
)

M = TypeVar("M", Job, Run)

#: What decoding a stored row may raise: pydantic's ValidationError and JSON errors are ValueErrors;
#: an unexpected column type or rank raises TypeError, KeyError or IndexError in the conversion.
DECODE_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError)

CORRUPT_TASK = "jobq.corrupt"
_PLACEHOLDERS: dict[type[Any], dict[str, Any]] = {
    Job: {
        "name": "",
        "target": TaskTarget(task=CORRUPT_TASK),
        "schedule": Schedule(type=ScheduleType.ONE_OFF),
        "created_ms": 0,
        "updated_ms": 0,
    },
    Run: {"nominal_ms": 0, "due_ms": 0, "state": RunState.FAILED, "created_ms": 0, "updated_ms": 0},
}
_REASON_CHARS = 300


def decode_job(doc: str | bytes, columns: Mapping[str, Any]) -> Job:
    """The job in the JSON document `doc`; a corrupt marker built from `columns` (the row's plain
    columns, in model terms) and the parts of `doc` that decode, when it does not."""
    try:
        return Job.model_validate_json(doc)
    except DECODE_ERRORS as exc:
        return corrupt_job(doc, columns, exc)


def corrupt_job(doc: str | bytes | Mapping[str, Any] | None, columns: Mapping[str, Any], error: Exception) -> Job:
    """A corrupt marker for a job row whose document `doc` failed with `error`."""
    parsed: Any = doc
    if isinstance(doc, str | bytes):
        try:
            parsed = json.loads(doc)
        except ValueError:
            parsed = None
    document = parsed if isinstance(parsed, Mapping) else {}
    return _marker(Job, document, columns, describe(error))


def decode_run(fields: Mapping[str, Any]) -> Run:
    """The run in `fields` (one value per `Run` field); a corrupt marker when it does not decode."""
    try:
        return Run.model_validate(fields)
    except DECODE_ERRORS as exc:
        return corrupt_run(fields, exc)


def corrupt_run(fields: Mapping[str, Any], error: Exception) -> Run:
    """A corrupt marker for a run row whose `fields` (raw or converted) failed with `error`."""
    if not isinstance(error, ValidationError):
        # A store's own conversion failed (a wrong attribute type, say): validation names the field.
        try:
            Run.model_validate({k: v for k, v in fields.items() if k in Run.model_fields})
        except ValidationError as found:
            error = found
    return _marker(Run, {}, fields, describe(error))


def decode_events(rows: Iterable[Any], where: str) -> list[RunEvent]:
    """The history events in `rows` (mappings of column to value); one that does not decode is
    skipped and logged (history is a record of what happened: one bad line must not hide the
    others)."""
    events: list[RunEvent] = []
    skipped: list[str] = []
    for row in rows:
        try:
            events.append(RunEvent.model_validate(dict(row)))
        except DECODE_ERRORS as exc:
            skipped.append(describe(exc))
    if skipped:
        logging.getLogger("jobq.history").warning(
            "%s: %d events that do not decode skipped (first: %s)", where, len(skipped), skipped[0]
        )
    return events


def priority_of(value: Any) -> Priority | Any:
    """A stored priority rank (0 = CRITICAL) as a `Priority`; any other value is passed on as it
    is, for validation to judge (a tier name decodes, anything else fails)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(PRIORITIES_BY_RANK):
        return PRIORITIES_BY_RANK[value]
    return value


def describe(error: Exception) -> str:
    """One line saying what did not decode, e.g. ``retry.max_retries: Input should be greater than
    or equal to 0 (got -1)``."""
    if isinstance(error, ValidationError):
        problems = error.errors(include_url=False)
        first = problems[0]
        where = ".".join(str(p) for p in first["loc"])
        text = f"{where}: {first['msg']}" if where else str(first["msg"])
        if "input" in first and not isinstance(first["input"], dict | list):
            text += f" (got {first['input']!r})"
        if len(problems) > 1:
            text += f" (and {len(problems) - 1} more)"
    else:
        text = f"{type(error).__name__}: {error}"
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 1] + "…"


def _marker(model: type[M], document: Mapping[str, Any], columns: Mapping[str, Any], reason: str) -> M:
    fields: dict[str, Any] = dict(_PLACEHOLDERS[model])
    for name in model.model_fields:
        if name == "corrupt":
            continue
        # Columns are what the store's narrow writes keep up to date: they win over the document.
        for source in (columns, document):
            if name in source:
                ok, value = _field(model, name, source[name])
                if ok:
                    fields[name] = value
                    break
    # `model_construct` skips validation: the placeholders stand in for what did not decode.
    return model.model_construct(**fields, corrupt=reason)


def _field(model: type[Job | Run], name: str, value: Any) -> tuple[bool, Any]:
    try:
        return True, _adapter(model, name).validate_python(value)
    except DECODE_ERRORS:
        return False, None


@cache
def _adapter(model: type[Job | Run], name: str) -> TypeAdapter[Any]:
    info = model.model_fields[name]
    annotation: Any = info.annotation
    if info.metadata:  # the field's own constraints (ge=..., max_length=...)
        annotation = Annotated[(annotation, *info.metadata)]
    return TypeAdapter(annotation)


def decode_tasks(docs: Iterable[str | bytes]) -> dict[str, TaskInfo]:
    """The task catalogue entries among stored JSON documents, by name; one that does not decode
    is logged and left out (the next worker that serves the task publishes it again)."""
    out: dict[str, TaskInfo] = {}
    for doc in docs:
        try:
            info = TaskInfo.model_validate_json(doc)
        except DECODE_ERRORS as exc:
            logging.getLogger("jobq.store").warning("a task catalogue entry does not decode: %s", str(exc)[:200])
            continue
        out[info.name] = info
    return out
