"""What jobq accepts at its edge, as types that cannot hold anything else.

Every entry point (the Python API, the CLI, `POST /v1/jobs` and the list queries) parses raw
input into these types (`JobSpec.parse`, `JobQuery`, `RunQuery`), and nothing outside them
reaches a store:

- `Text`: a string without NUL (U+0000) or lone surrogates (U+D800..U+DFFF). PostgreSQL refuses
  NUL in text and JSON, and a lone surrogate cannot be encoded as UTF-8, so either would fail
  the write, or every later read, of the record that held it.
- `Instant`: epoch milliseconds within `jobq.instants` (1970 .. 9999).
- `Payload`: a JSON value (objects with text keys, arrays, text, finite numbers, booleans,
  null) nested at most `MAX_PAYLOAD_DEPTH` deep; its text obeys `Text`.
- Non-negative finite durations are plain `Field(ge=0, le=...)` floats in models whose config
  refuses NaN and infinities (`allow_inf_nan=False`).

`invalid_job` turns pydantic's `ValidationError` into the one error the Python API raises for
bad input, `InvalidJob`, naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, ValidationError
from pydantic_core import PydanticCustomError

from jobq.errors import InvalidJob
from jobq.instants import MAX_INSTANT_MS, MIN_INSTANT_MS, describe_range, in_range
from jobq.texts import text_problem

MAX_PAYLOAD_DEPTH = 64  # arrays and objects inside each other; pydantic's serializer stops near 250
# What pydantic puts into error locations besides field names: validator wrappers, union members
# and the tags of the target union.
_NOISE_PREFIXES = ("function-", "constrained-", "lax-", "strict-", "nullable[")
_NOISE_PARTS = frozenset({"int", "str", "float", "bool", "TASK", "HTTP_WEBHOOK", "[key]"})


def check_text(value: str) -> str:
    """`value`, or a `PydanticCustomError` saying why it cannot be stored as text."""
    problem = text_problem(value)
    if problem is not None:
        raise PydanticCustomError("unstorable_text", "text {problem}", {"problem": problem})
    return value


def check_instant(value: int) -> int:
    """`value`, or a `PydanticCustomError` when it is outside the instants jobq accepts."""
    if not in_range(value):
        raise PydanticCustomError(
            "instant_out_of_range",
            "{value} ms is outside the instants jobq accepts ({range})",
            {"value": value, "range": describe_range()},
        )
    return value


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise PydanticCustomError("instant_type", "an instant is epoch milliseconds, not a boolean")
    return value


Text = Annotated[str, AfterValidator(check_text)]
# The range is in the schema (OpenAPI `minimum`/`maximum`); `check_instant` words the refusal better
# where a field validator runs first (`JobSpec.run_at`).
Instant = Annotated[int, Field(ge=MIN_INSTANT_MS, le=MAX_INSTANT_MS), BeforeValidator(_not_bool)]


def _where(path: tuple[str | int, ...]) -> str:
    return "payload" + "".join(f"[{step!r}]" for step in path)


def check_payload(value: Any) -> Any:
    """`value` unchanged when it is a storable JSON value; else a `PydanticCustomError` naming
    where it is not. Walks iteratively, so depth is refused politely, not by a RecursionError."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if item is None or isinstance(item, bool | int):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise PydanticCustomError("payload", "{where} is {item}: JSON numbers are finite", _ctx(path, item))
            continue
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                raise PydanticCustomError("payload", "{where} {problem}", {"where": _where(path), "problem": problem})
            continue
        if len(path) >= MAX_PAYLOAD_DEPTH:
            raise PydanticCustomError(
                "payload", "the payload is nested deeper than {depth} levels", {"depth": MAX_PAYLOAD_DEPTH}
            )
        if isinstance(item, list | tuple):
            stack.extend((element, (*path, i)) for i, element in enumerate(item))
        elif isinstance(item, dict):
            for key, element in item.items():
                if not isinstance(key, str):
                    raise PydanticCustomError(
                        "payload", "{where} has the key {key}: JSON object keys are text", _ctx(path, key, "key")
                    )
                problem = text_problem(key)
                if problem is not None:
                    raise PydanticCustomError(
                        "payload", "a key of {where} {problem}", {"where": _where(path), "problem": problem}
                    )
                stack.append((element, (*path, key)))
        else:
            raise PydanticCustomError(
                "payload",
                "{where} is a Python {kind}, not a JSON value",
                {"where": _where(path), "kind": type(item).__name__},
            )
    return value


def _ctx(path: tuple[str | int, ...], item: Any, name: str = "item") -> dict[str, Any]:
    return {"where": _where(path), name: repr(item)}


Payload = Annotated[Any, AfterValidator(check_payload)]


def field_name(location: tuple[int | str, ...] | list[int | str]) -> str:
    """`("target", "HTTP_WEBHOOK", "headers")` -> `"target.headers"`."""
    parts = [str(p) for p in location]
    return ".".join(p for p in parts if not p.startswith(_NOISE_PREFIXES) and p not in _NOISE_PARTS)


def invalid_job(exc: ValidationError, names: Mapping[str, str] | None = None) -> InvalidJob:
    """The `InvalidJob` for the first error of `exc`; `names` renames fields in the message (the
    CLI says `--max-retries` where the field is `retry_policy.max_retries`)."""
    error = exc.errors()[0]
    field = field_name(error["loc"]) or None
    shown = field
    if field is not None and names:
        # the longest renamed prefix: `retry_policy.max_retries` under {"retry_policy": "retry"} is `retry.max_retries`
        matches = [k for k in names if field == k or field.startswith(k + ".")]
        if matches:
            prefix = max(matches, key=len)
            shown = names[prefix] + field[len(prefix) :]
    message = str(error["msg"])
    return InvalidJob(f"{shown}: {message}" if shown else message, field=field)
