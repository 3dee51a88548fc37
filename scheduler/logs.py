"""Logs: compact text for people, JSON for machines; every line about a run names it.

Daemon call sites pass `extra=run_fields(run)`. Around a task's execution `run_context` binds the
same fields to the running context (a context variable: per thread, greenlet and asyncio task,
and set again in a child process by whatever runs the task there), and the `RunFields` filter
adds them to every record made meanwhile, so a task's own `logging.getLogger(__name__).info(...)`
is attributed too.

Text lines keep to 120 columns for a typical line: `HH:MM:SS.mmm LEVEL logger message`, then the
run as `run=<last 8 characters of the job id>:<fire ms> a=<attempt> f=<fence>` and other fields as
`key=value`. JSON lines carry the full ids. Both formats pass the whole line (message, fields and
traceback) through `redact_text`, so a connection URL's password or a secret never reaches a log.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

from jobq.models import DEFAULT_TENANT, Run
from jobq.redaction import redact_text

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
_RUN_KEYS = ("job_id", "run_id", "attempt", "fence", "tenant_id", "trace_id")  # trace_id: JSON only
SHORT_JOB_ID = 8  # characters of a job id that text lines keep: its random tail

_current: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar("jobq_run_fields", default=None)


def run_fields(run: Run, **more: Any) -> dict[str, Any]:
    fields = {"job_id": run.job_id, "run_id": run.run_id, "fence": run.fence, "attempt": run.attempt, **more}
    if run.tenant_id != DEFAULT_TENANT:  # job ids are per tenant
        fields["tenant_id"] = run.tenant_id
    return fields


@contextlib.contextmanager
def run_context(fields: Mapping[str, Any]) -> Iterator[None]:
    """Attach `fields` to every record logged in this context until the block ends."""
    token = _current.set(fields)
    try:
        yield
    finally:
        _current.reset(token)


class RunFields(logging.Filter):
    """Adds the fields of the run executing in this context (`run_context`) to each record that
    lacks them. `configure` puts it on its handler; an application that configures logging itself
    can add it to its own handlers."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = _current.get()
        if fields:
            for key, value in fields.items():
                record.__dict__.setdefault(key, value)
        return True


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


def short_run_id(run_id: str) -> str:
    """The text-log form of a run id: the job id's last `SHORT_JOB_ID` characters (its random
    tail), a colon and the fire time, e.g. `m3xk9qpz:1790834400000`; the tenant is shown apart."""
    job, sep, nominal = str(run_id).rpartition(":")
    if not sep:
        return str(run_id)
    job = job.rpartition("/")[2]
    return f"{job[-SHORT_JOB_ID:]}:{nominal}"


# Libraries whose INFO lines are one per request or connection (httpx logs every webhook call).
_CHATTY = ("httpx", "httpcore", "urllib3", "botocore", "boto3", "s3transfer", "kombu", "amqp", "psycopg", "moto")
_COLOURS = {
    "DEBUG": "\x1b[2m",
    "INFO": "\x1b[32m",
    "WARNING": "\x1b[33m",
    "ERROR": "\x1b[31m",
    "CRITICAL": "\x1b[1;31m",
}
_LEVELS = {"WARNING": "WARN", "CRITICAL": "CRIT"}  # five columns at most


class LogfmtFormatter(logging.Formatter):
    """`10:13:38.123 INFO  jobq.worker succeeded run=m3xk9qpz:1790834400000 a=1 f=3`; the level
    coloured when `colour` (a terminal)."""

    def __init__(self, colour: bool = False) -> None:
        super().__init__()
        self.colour = colour

    def format(self, record: logging.LogRecord) -> str:
        level = _LEVELS.get(record.levelname, record.levelname).ljust(5)
        if self.colour:
            level = f"{_COLOURS.get(record.levelname, '')}{level}\x1b[0m"
        parts = [
            f"{self.formatTime(record, '%H:%M:%S')}.{int(record.msecs):03d}",
            level,
            record.name,
            record.getMessage(),
        ]
        fields = _fields(record)
        if "run_id" in fields:
            # The job id is in the run id, the trace id is for machines: both are left to JSON.
            parts.append(f"run={short_run_id(fields['run_id'])}")
            parts += [f"{k[0]}={fields[k]}" for k in ("attempt", "fence") if k in fields]
            if "tenant_id" in fields:
                parts.append(f"tenant={_quote(fields['tenant_id'])}")
            fields = {k: v for k, v in fields.items() if k not in _RUN_KEYS}
        parts += [f"{k}={_quote(v)}" for k, v in fields.items()]
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return redact_text(line)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return redact_text(json.dumps(doc, default=str))


def _quote(value: object) -> str:
    text = str(value)
    return json.dumps(text) if (" " in text or "=" in text or '"' in text or not text) else text


def wants_colour(stream: TextIO) -> bool:
    """Colour on a terminal only, and never with NO_COLOR set (https://no-color.org)."""
    if os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def configure(level: str = "INFO", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Send the logs of this process to `stream` (stderr) in `fmt`, at `level`.

    When the application has configured logging itself (the root logger has handlers that are
    not ours), its handlers are left alone and jobq's records propagate to them; only the level of
    jobq's loggers is set. Otherwise the root logger gets our handler, so a task's own loggers
    print too. Idempotent: configuring again replaces our handler."""
    stream = sys.stderr if stream is None else stream
    root = logging.getLogger()
    jobq = logging.getLogger("jobq")
    jobq.handlers[:] = [h for h in jobq.handlers if not getattr(h, "_jobq", False)]
    jobq.propagate = True
    jobq.setLevel(level.upper())
    theirs = [h for h in root.handlers if not getattr(h, "_jobq", False)]
    if theirs:
        root.handlers[:] = theirs
        return
    for name in _CHATTY:  # a line per HTTP request or connection: theirs at DEBUG only
        library = logging.getLogger(name)
        if library.level == logging.NOTSET and logging.getLevelName(level.upper()) != logging.DEBUG:
            library.setLevel(logging.WARNING)
    handler = logging.StreamHandler(stream)
    handler._jobq = True  # type: ignore[attr-defined]  # marks the handler `configure` owns
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter(colour=wants_colour(stream)))
    handler.addFilter(RunFields())
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
