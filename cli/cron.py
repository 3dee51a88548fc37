"""`jobq cron`: preview a cron expression's fires, in local time and UTC, with what DST did to them."""

from __future__ import annotations

from typing import Any

import click

from jobq.cli.common import console, json_option, print_json
from jobq.cli.common import table as new_table
from jobq.clock import SYSTEM_CLOCK
from jobq.cronpreview import MAX_FIRES, PreviewSpec, preview_document
from jobq.cronpreview import document as preview_of
from jobq.schedules import cron_for, parse_cron
from jobq.settings import Settings
from jobq.submission import JobSpec, Limits, build_job
from jobq.views import iso, job_summary


@click.command(name="cron")
@click.argument("expression")
@click.option("--tz", "timezone", default="UTC", show_default=True, help="IANA timezone the expression is read in.")
@click.option(
    "--next", "count", type=click.IntRange(1, MAX_FIRES), default=10, show_default=True, help="How many fires."
)
@click.option("--after", default=None, help="Start after: ISO 8601 (naive times are read in --tz) or epoch ms [now].")
@click.option("--job-id", default=None, help="The job id H picks its values from (needed when EXPRESSION uses H).")
@click.option("--dst-gap", type=click.Choice(["skip", "shift"]), default="skip", show_default=True)
@click.option("--dst-overlap", type=click.Choice(["once", "twice"]), default="once", show_default=True)
@json_option
def cron(
    expression: str,
    timezone: str,
    count: int,
    after: str | None,
    job_id: str | None,
    dst_gap: str,
    dst_overlap: str,
    as_json: bool,
) -> None:
    """Show EXPRESSION's next fires in local time and UTC, marking those a DST rule moved or skipped.

    Nothing is stored and no backend is needed. The same as POST /v1/schedules:preview."""
    spec = PreviewSpec.model_validate(
        {
            "cron_expression": expression,
            "timezone": timezone,
            "count": count,
            "after": after,
            "job_id": job_id,
            "dst_gap": dst_gap,
            "dst_overlap": dst_overlap,
        }
    )
    document = preview_document(spec, SYSTEM_CLOCK.now_ms())
    if as_json:
        print_json(document)
        return
    print_preview(document)


def print_preview(document: dict[str, Any]) -> None:
    """The preview as a table: one row per fire, and one per group of wall times DST dropped."""
    source, expression = document["cron_source"], document["cron_expression"]
    shown = expression if source == expression else f"{expression}  (written {source})"
    console.print(f"cron_expression  {shown}")
    console.print(
        f"timezone         {document['timezone']}  dst_gap={document['dst_gap']}  dst_overlap={document['dst_overlap']}"
    )
    rows = new_table("#", "local", "UTC", "DST")
    fire = 0
    for event in document["events"]:
        local = f"{event['local'].replace('T', ' ')} {event['zone']}"
        if event["kind"] == "fire":
            fire += 1
            note = f"{event['dst']}: {event['reason']}" if event["dst"] else ""
            rows.add_row(str(fire), local, event["utc"], note)
        else:
            walls = ", ".join(w.replace("T", " ") for w in event["wall_times"])
            more = event["wall_time_count"] - len(event["wall_times"])
            walls += f" (+{more})" if more > 0 else ""
            rows.add_row("-", f"{walls} skipped", "-", f"{event['dst']}: {event['reason']}")
    console.print(rows)
    if fire == 0:
        console.print("no fires in the 10 years after the start")


def dry_run_schedule(spec: JobSpec, settings: Settings, count: int, as_json: bool) -> None:
    """`jobq schedule --dry-run`: build the job as submission would, print it with its next fires,
    and touch no backend.

    The task name is not checked (only the store knows every worker's tasks). With `H` the job id
    must be given: a generated one would pick other values than the job finally submitted."""
    if spec.cron_expression is not None and spec.job_id is None:
        parse_cron(spec.cron_expression, spec.cron_dialect)  # refuses `H` without a job id
    now = SYSTEM_CLOCK.now_ms()
    job, _runs, _missed = build_job(spec, now, Limits.from_settings(settings))
    schedule = job.schedule
    preview = None
    if job.recurring:
        preview = preview_of(cron_for(schedule), schedule.cron_source or "", now, count, job_id=spec.job_id)
    if as_json:
        summary = job_summary(job)
        if spec.job_id is None:
            summary["job_id"] = None  # the id a real submission gets is generated then
        at = [iso(schedule.at_ms)] if schedule.at_ms is not None else []
        print_json({"dry_run": True, "job": summary, "next_fire_times": at, "preview": preview})
        return
    console.print(f"dry run, nothing stored: {job.name}  {schedule.type.value}  {job.priority.value}")
    if preview is not None:
        print_preview(preview)
    else:
        console.print(f"fires at {iso(schedule.at_ms)}")
