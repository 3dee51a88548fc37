"""`python otel_cli.py ARGS...`: the `jobq` command with OpenTelemetry's SDK and its in-memory
exporter installed as the application's tracer provider (jobq's `tracing=auto` uses it). At exit
the finished spans are written, one JSON object a line, to the file named by `JOBQ_TEST_SPANS`,
so a test can follow one trace across processes."""

from __future__ import annotations

import atexit
import json
import os
import sys

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)


def dump() -> None:
    with open(os.environ["JOBQ_TEST_SPANS"], "w") as out:
        for span in exporter.get_finished_spans():
            doc = {
                "name": span.name,
                "kind": span.kind.name,
                "trace_id": f"{span.context.trace_id:032x}",
                "span_id": f"{span.context.span_id:016x}",
                "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
                "links": [f"{link.context.span_id:016x}" for link in span.links],
                "attributes": dict(span.attributes or {}),
                "status": span.status.status_code.name,
            }
            out.write(json.dumps(doc) + "\n")


atexit.register(dump)

if __name__ == "__main__":
    from jobq.cli.main import cli

    cli(sys.argv[1:], prog_name="jobq")
