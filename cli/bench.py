"""`jobq bench`: measure the configured deployment with the W1 and W2 workloads."""

from __future__ import annotations

from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from jobq.bench import Bench, Result
from jobq.cli.common import backend_options, console, deployment, load_settings, print_json, table
from jobq.daemons.worker.pools import POOLS

WORKLOADS = ("instant", "spike", "priority-spike", "spread")


@click.command()
@click.option(
    "-w",
    "--workload",
    "workloads",
    multiple=True,
    type=click.Choice([*WORKLOADS, "all"]),
    default=("all",),
    help="instant (W1), spike (W2), priority-spike (LOW spike + CRITICAL), spread (W2 spread).",
)
@click.option("-n", "--runs", type=click.IntRange(1), default=None, help="Runs per workload [W1 20,000; W2 10,000].")
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True, help="Worker processes.")
@click.option("-c", "--concurrency", type=click.IntRange(1, 10_000), default=64, show_default=True)
@click.option("-P", "--pool", type=click.Choice(POOLS), default="threads", show_default=True, help="The workers' pool.")
@click.option("--lead", "lead_s", type=float, default=10.0, show_default=True, help="Seconds before a spike is due.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@backend_options
def bench(
    workloads: tuple[str, ...],
    runs: int | None,
    workers: int,
    concurrency: int,
    pool: str,
    lead_s: float,
    as_json: bool,
    **options: Any,
) -> None:
    """Run benchmark workloads against the configured deployment (keep it otherwise idle: the
    bench starts its own scanner, reaper and workers, which would share the queues)."""
    chosen = WORKLOADS if "all" in workloads else tuple(dict.fromkeys(workloads))
    results: list[Result] = []
    with (
        deployment(load_settings(options)) as d,
        Progress(
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=as_json,
        ) as progress,
    ):
        task = progress.add_task("starting", total=1)

        def report(phase: str, done: int, total: int) -> None:
            progress.update(task, description=phase, completed=done, total=total)

        b = Bench(d, workers=workers, concurrency=concurrency, pool=pool, progress=report)
        for name in chosen:
            if name == "instant":
                results.append(b.instant(runs or 20_000))
            elif name == "spike":
                results.append(b.spike(runs or 10_000, lead_s=lead_s))
            elif name == "priority-spike":
                results.append(b.spike(runs or 50_000, lead_s=max(lead_s, 30.0), critical=100))
            else:
                results.append(b.spread(runs or 1_000))
    if as_json:
        print_json([_doc(r) for r in results])
        return
    out = table("workload", "runs", "once", "enqueue/s", "runs/s", "dispatch p50/p99/max ms", "start p50/p99/max ms")
    for r in results:
        out.add_row(
            r.name,
            str(r.runs),
            "yes" if r.executed_once else "NO",
            _num(r.enqueue_per_s),
            _num(r.runs_per_s),
            _lat(r.dispatch_lateness_ms),
            _lat(r.start_lateness_ms),
        )
    console.print(out)


def _num(value: float) -> str:
    return f"{value:,.0f}" if value else "-"


def _lat(p: Any) -> str:
    return "-" if p is None else f"{p.p50:,.0f} / {p.p99:,.0f} / {p.max:,.0f}"


def _doc(r: Result) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "workload": r.name,
        "runs": r.runs,
        "executed_once": r.executed_once,
        "enqueue_per_s": r.enqueue_per_s,
        "runs_per_s": r.runs_per_s,
        "elapsed_s": r.elapsed_s,
        **r.notes,
    }
    for key in ("dispatch_lateness_ms", "start_lateness_ms"):
        value = getattr(r, key)
        if value is not None:
            doc[key] = {"p50": value.p50, "p95": value.p95, "p99": value.p99, "max": value.max}
    return doc
