"""Structured logs: logfmt for people, JSON for machines; every line about a run names it.

Call sites pass `extra=run_fields(run)`; the formatters render those fields after the message.
Both formats pass the whole line (message, fields and traceback) through `redact_text`, so a
connection URL's password or a secret parameter never reaches a log.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from jobq.models import DEFAULT_TENANT, Run
from jobq.redaction import redact_text

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def run_fields(run: Run, **more: Any) -> dict[str, Any]:
    fields = {"job_id": run.job_id, "run_id": run.run_id, "fence": run.fence, "attempt": run.attempt, **more}
    if run.tenant_id != DEFAULT_TENANT:  # job ids are per tenant
        fields["tenant_id"] = run.tenant_id
    return fields


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        parts = [
            f"{self.formatTime(record, '%Y-%m-%dT%H:%M:%S')}.{int(record.msecs):03d}",
            record.levelname.lower(),
            record.name,
            record.getMessage(),
        ]
        parts += [f"{k}={_quote(v)}" for k, v in _fields(record).items()]
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


def configure(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger("jobq")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
