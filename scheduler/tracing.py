"""OpenTelemetry tracing, optional: spans when `jobq[otel]` is installed, nothing otherwise.

A job carries the W3C trace context (its `traceparent`) of the request or `Client` call that
submitted it; its runs carry the context their spans continue (the submitter's for a one-off or
immediate job; for a recurring job, a new trace per fire linked to the submitter's, see
docs/tracing.md). The scanner's dispatch span, the worker's execution span and the webhook's
client span follow from there; the envelope carries the dispatch span's context to the worker.

`mode` (setting `tracing`, `JOBQ_TRACING`):

- ``auto`` (default): spans go to whatever tracer provider the application installed (none: the
  OpenTelemetry API's no-op); without the `opentelemetry-api` package, nothing at all.
- ``console`` / ``otlp``: a daemon installs the SDK's provider with that exporter; without the
  extra this is a `MissingExtra` error at start-up.
- ``off``: no spans and no stored contexts, even if the application traces.

Every function here is cheap without OpenTelemetry, or while no tracer provider is installed: a
global read or two, then a no-op (the stored contexts still travel with the runs).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from jobq.errors import ConfigError
from jobq.extras import require
from jobq.models import Job, Run

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanKind, Tracer

_TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
Attributes = dict[str, str | int | float | bool]
Kind = Literal["internal", "server", "client", "producer", "consumer"]
MODES = ("auto", "console", "otlp", "off")


class _State:
    """Whether to trace at all, and the tracer once made (None: not yet looked at)."""

    enabled: bool | None = None
    tracer: Tracer | None = None
    pinned: bool = False  # `tracer` was given directly (tests), not taken from the global provider
    provider: Callable[[], object] | None = None  # OpenTelemetry's `get_tracer_provider`
    placeholder: type | None = None  # the provider the API returns while none is installed
    propagator: Any = None  # the W3C trace-context propagator
    installed: str | None = None  # the exporter of the provider `configure` installed
    off: bool = False  # `tracing=off`: not even stored contexts are forwarded


_state = _State()


def _load() -> bool:
    """Import OpenTelemetry once; False without it."""
    if _state.enabled is None:
        try:
            from opentelemetry import trace
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            _state.enabled = False
            return False
        from jobq import __version__

        _state.provider, _state.placeholder = trace.get_tracer_provider, trace.ProxyTracerProvider
        _state.propagator = TraceContextTextMapPropagator()
        # A proxy until the application sets a provider; it follows the provider set later.
        _state.tracer = trace.get_tracer("jobq", __version__)
        _state.enabled = True
    return _state.enabled


def _tracer() -> Tracer | None:
    """jobq's tracer, or None when no span would be recorded: without OpenTelemetry, and while no
    tracer provider is installed (the API's no-op spans cost ~20 us each on the scanner's path)."""
    if not _load() or _state.off:
        return None
    if _state.pinned:
        return _state.tracer
    assert _state.provider is not None and _state.placeholder is not None
    return None if isinstance(_state.provider(), _state.placeholder) else _state.tracer


def pin(tracer: Tracer | None) -> None:
    """Make jobq's spans with `tracer` whatever provider is global (tests, embedding); None goes
    back to following the global provider."""
    if not _load():
        return
    from opentelemetry import trace

    from jobq import __version__

    _state.pinned = tracer is not None
    _state.tracer = tracer if tracer is not None else trace.get_tracer("jobq", __version__)


def configure(mode: str, service_name: str) -> None:
    """Set tracing up for a daemon: `mode` as in the module docstring. Call once, at start-up.

    Raises `MissingExtra` when `console` or `otlp` is asked for without `jobq[otel]`, and
    `ConfigError` for an unknown mode."""
    if mode not in MODES:
        raise ConfigError("tracing", mode, f"use one of {', '.join(MODES)}")
    _state.off = mode == "off"
    if mode in ("off", "auto", _state.installed):
        return
    require("opentelemetry.sdk.trace", "otel", f"tracing={mode}")
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    exporter: SpanExporter
    if mode == "otlp":
        otlp = require("opentelemetry.exporter.otlp.proto.http.trace_exporter", "otel", "tracing=otlp")
        exporter = otlp.OTLPSpanExporter()  # OTEL_EXPORTER_OTLP_* variables say where
    else:
        exporter = ConsoleSpanExporter()
    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; ours is the default.
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    provider = TracerProvider(resource=resource)  # OTEL_TRACES_SAMPLER picks the sampler
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _state.installed = mode


def current_traceparent() -> str | None:
    """The `traceparent` of the span current in this context: what a submission stores."""
    if _tracer() is None:
        return None
    carrier: dict[str, str] = {}
    _state.propagator.inject(carrier)
    return carrier.get("traceparent")


def inject(headers: dict[str, str], fallback: str | None = None) -> None:
    """Add the current span's `traceparent` (and `tracestate`) to outgoing request headers; without
    a current span (no OpenTelemetry here), `fallback`, the context stored with the run, so the
    receiver still joins the submitter's trace. Nothing when tracing is `off`."""
    if _tracer() is not None:
        _state.propagator.inject(headers)
    if "traceparent" not in headers and not _state.off and valid_traceparent(fallback):
        headers["traceparent"] = str(fallback)


def valid_traceparent(value: str | None) -> str | None:
    """`value` when it is a W3C traceparent (version 00, non-zero ids), else None: a bad header is
    ignored, as the W3C recommendation asks. Needs no OpenTelemetry, so a process without the
    extra still stores its callers' contexts for the daemons that trace. None with `tracing=off`."""
    if not value or _state.off or not _TRACEPARENT.fullmatch(value):
        return None
    _, trace_id, span_id, _ = value.split("-")
    return value if trace_id != "0" * 32 and span_id != "0" * 16 else None


def _context_of(traceparent: str | None) -> Context | None:
    from opentelemetry import trace

    if not traceparent:
        return None
    context = _state.propagator.extract({"traceparent": traceparent})
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def _kind(kind: Kind) -> SpanKind:
    from opentelemetry.trace import SpanKind

    return SpanKind[kind.upper()]


@contextlib.contextmanager
def span(
    name: str,
    *,
    parent: str | None = None,
    links: Sequence[str | None] = (),
    kind: Kind = "internal",
    attributes: Mapping[str, str | int | float | bool] | None = None,
    root: bool = False,
) -> Iterator[Span | None]:
    """A span made current for the block: a child of `parent` (a traceparent) when given, else of
    the current span (or a new trace when `root`), linked to `links`. Yields None without
    OpenTelemetry. An exception leaving the block is recorded and the span marked as an error."""
    tracer = _tracer()
    if tracer is None:
        yield None
        return
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    context = _context_of(parent)
    if context is None and root:
        context = otel_context.Context()  # empty: a new trace, whatever is current
    linked = [trace.Link(trace.get_current_span(c).get_span_context()) for c in map(_context_of, links) if c]
    with tracer.start_as_current_span(
        name, context=context, kind=_kind(kind), attributes=dict(attributes or {}), links=linked
    ) as current:
        yield current


def traceparent_of(current: Span | None) -> str | None:
    """The traceparent a child of `current` (a span from `span`) continues; None without one."""
    if current is None or not current.get_span_context().is_valid:
        return None
    from opentelemetry import trace

    carrier: dict[str, str] = {}
    _state.propagator.inject(carrier, trace.set_span_in_context(current))
    return carrier.get("traceparent")


def set_attributes(current: Span | None, attributes: Mapping[str, str | int | float | bool | None]) -> None:
    if current is not None:
        current.set_attributes({k: v for k, v in attributes.items() if v is not None})


def trace_id_of(traceparent: str | None) -> str | None:
    """The 32-hex trace id of a traceparent (`00-<trace id>-<span id>-<flags>`), for logs."""
    parts = (traceparent or "").split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None


# -- jobq's spans ----------------------------------------------------------------------------------


def run_attributes(run: Run) -> Attributes:
    """The attributes every span about `run` carries (names in docs/tracing.md)."""
    attributes: Attributes = {
        "jobq.run_id": run.run_id,
        "jobq.job_id": run.job_id,
        "jobq.attempt": run.attempt,
        "jobq.fence": run.fence,
        "jobq.tier": run.priority.queue,
        "messaging.system": "jobq",
        "messaging.destination.name": run.priority.queue,
        "messaging.message.id": run.run_id,
    }
    if run.tenant_id != "default":
        attributes["jobq.tenant_id"] = run.tenant_id
    return attributes


def fire_trace(job: Job, nominal_ms: int) -> str | None:
    """The trace a recurring job's fire starts: a `jobq.fire` span that begins a new trace, linked
    to the job's submission; its traceparent is what the run stores. None when nothing records."""
    if _tracer() is None:
        return None
    attributes: Attributes = {"jobq.job_id": job.job_id, "jobq.nominal_ms": nominal_ms, "jobq.tier": job.priority.queue}
    with span("jobq.fire", root=True, links=[job.trace], attributes=attributes) as current:
        return traceparent_of(current)


def dispatch_trace(run: Run, now_ms: int) -> str | None:
    """Record `run`'s dispatch (a producer span, a child of the run's trace) and return the context
    the worker continues: the span's, or the run's own when nothing records."""
    if _tracer() is None:
        return run.trace
    attributes = {
        **run_attributes(run),
        "messaging.operation.type": "send",
        "jobq.lateness_ms": max(0, now_ms - run.due_ms),
    }
    with span("jobq.dispatch", parent=run.trace, kind="producer", attributes=attributes) as current:
        return traceparent_of(current) or run.trace


def record_error(current: Span | None, exc: BaseException, message: str) -> None:
    """Mark `current` as failed by `exc` (a task's exception, caught before the span ends)."""
    if current is None:
        return
    from opentelemetry.trace import Status, StatusCode

    current.record_exception(exc)
    current.set_status(Status(StatusCode.ERROR, message))
