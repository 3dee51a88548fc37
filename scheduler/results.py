"""A run's result as a caller sees it: its value, or why there is none (yet).

The worker keeps a task's return value on the run (`Run.result`) when it is JSON of at most
64 KiB (`jobq.daemons.worker.execution.RESULT_MAX_BYTES`); otherwise it keeps a marker saying why
not (`keepable`), and the run still
succeeds: the task did its work, and failing the run would run it again. A result is kept for
`result_ttl_s` after the run finished; from then on it is expired, whether or not the reaper has
cleared it from the store yet (reads decide by time, the reaper's pass frees the space).

`read_result` is the one interpretation shared by `Client.result`, `JobHandle.get`,
`jobq result` and `GET /v1/runs/{run_id}`.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from typing import Any

from jobq.errors import ResultExpired, ResultNotKept, TaskCancelled, TaskFailed
from jobq.models import Run, RunState
from jobq.texts import text_problem

NOT_KEPT = "jobq_result_not_kept"  # the key of the marker kept instead of a value that was not kept

# What the retry decision appends to a final error (`jobq.retry.decide`): not part of the task's message.
_VERDICT = re.compile(r" \((?:attempt \d+ of \d+|non-retryable|older than max_age_sec=[^)]*)\)$")
_ERROR_TYPE = re.compile(r"^([A-Za-z_][\w.]*): (.*)$", re.DOTALL)


class ResultState(enum.StrEnum):
    PENDING = "PENDING"  # the run has not finished: scheduled, running, or waiting to retry
    SUCCEEDED = "SUCCEEDED"  # `value` is the task's return value
    FAILED = "FAILED"  # the task's final error: `error_type`, `error`
    CANCELLED = "CANCELLED"
    EXPIRED = "EXPIRED"  # succeeded, but the result is older than `result_ttl_s`
    NOT_KEPT = "NOT_KEPT"  # succeeded, but the value was not JSON or too large: `error` says which


@dataclass(frozen=True, slots=True)
class RunResult:
    run_id: str
    state: ResultState
    value: Any = None
    error_type: str | None = None
    error: str | None = None
    expires_ms: int | None = None  # when a finished run's result expires (expired at, once EXPIRED)
    dead_letter: bool = False

    def unwrap(self) -> Any:
        """The value of a SUCCEEDED run; raises the `ResultError` of every other finished state.
        Must not be called on a PENDING result (the caller waits first)."""
        if self.state is ResultState.SUCCEEDED:
            return self.value
        if self.state is ResultState.FAILED:
            raise TaskFailed(
                self.run_id,
                self.error_type or "Error",
                self.error or "",
                dead_letter=self.dead_letter,
                result=self.value,
            )
        if self.state is ResultState.CANCELLED:
            raise TaskCancelled(self.run_id, self.error)
        if self.state is ResultState.EXPIRED:
            raise ResultExpired(self.run_id, self.expires_ms or 0)
        if self.state is ResultState.NOT_KEPT:
            raise ResultNotKept(self.run_id, self.error or "")
        raise AssertionError(f"run {self.run_id!r} has not finished")

    def as_json(self) -> dict[str, Any]:
        from jobq.instants import to_iso

        return {
            "result_state": self.state.value,
            "result": self.value,
            "error_type": self.error_type,
            "error": self.error,
            "result_expires_at": None if self.expires_ms is None else to_iso(self.expires_ms),
        }


def not_kept(reason: str, **details: Any) -> dict[str, Any]:
    """The marker the worker keeps instead of a return value it cannot keep."""
    return {NOT_KEPT: reason, **details}


def keepable(value: Any, max_bytes: int) -> Any:
    """What to keep of a task's return value: itself when it is JSON of at most `max_bytes` that
    every store can hold, else a marker saying why not."""
    if value is None:
        return None
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return not_kept(f"not JSON ({exc})"[:500], repr=_shown(value))
    if len(text) > max_bytes:  # ASCII: a character is a byte
        return not_kept(f"too large ({len(text)} bytes of JSON, more than {max_bytes})", size=len(text))
    problem = _unstorable(value)
    if problem is not None:  # PostgreSQL's jsonb refuses these, and so would any text column
        return not_kept(f"not storable: a string {problem}", repr=_shown(value))
    return value


def _shown(value: Any) -> str:
    """The value's repr, cut and made storable text (a custom `__repr__` may return anything)."""
    text = repr(value)[:1000].replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _unstorable(value: Any) -> str | None:
    """Why a JSON value holds text no store can keep (NUL, lone surrogates), or None."""
    if isinstance(value, str):
        return text_problem(value)
    if isinstance(value, dict):
        for k, v in value.items():
            problem = text_problem(k) if isinstance(k, str) else None
            if (problem := problem or _unstorable(v)) is not None:
                return problem
    elif isinstance(value, list | tuple):
        for item in value:
            if (problem := _unstorable(item)) is not None:
                return problem
    return None


def split_error(text: str | None) -> tuple[str, str]:
    """`("ValueError", "bad input")` from a recorded error `ValueError: bad input (attempt 3 of 3)`."""
    if not text:
        return "Error", ""
    text = _VERDICT.sub("", text)
    match = _ERROR_TYPE.match(text)
    if match is None:
        return "Error", text
    return match.group(1), match.group(2)


def read_result(run: Run, now_ms: int, ttl_s: float) -> RunResult:
    """What `run`'s result is at `now_ms` when results are kept `ttl_s` seconds."""
    expires = None if run.finished_ms is None else run.finished_ms + round(ttl_s * 1000)
    if run.state is RunState.SUCCEEDED:
        if expires is not None and expires <= now_ms:
            return RunResult(run.run_id, ResultState.EXPIRED, expires_ms=expires)
        value = run.result
        if isinstance(value, dict) and NOT_KEPT in value:
            return RunResult(run.run_id, ResultState.NOT_KEPT, error=str(value[NOT_KEPT]), expires_ms=expires)
        return RunResult(run.run_id, ResultState.SUCCEEDED, value, expires_ms=expires)
    if run.state is RunState.FAILED:
        error_type, message = split_error(run.last_error)
        value = None if expires is not None and expires <= now_ms else run.result
        return RunResult(
            run.run_id, ResultState.FAILED, value, error_type, message, expires_ms=expires, dead_letter=run.dead_letter
        )
    if run.state is RunState.CANCELLED:
        return RunResult(run.run_id, ResultState.CANCELLED, error=run.last_error, expires_ms=expires)
    return RunResult(run.run_id, ResultState.PENDING)
