"""The HTTP API commands: `jobq api` and `jobq tokens create|list|revoke`; and the helpers `jobq dev`
and `jobq worker` use to serve the API and call webhooks when the `api` extra is installed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from jobq import logs, tracing
from jobq.cli.common import (
    backend_options,
    console,
    deployment,
    err_console,
    fail,
    json_option,
    load_settings,
    ms_to_text,
    print_json,
    reader,
)
from jobq.cli.common import table as new_table
from jobq.deployment import Deployment
from jobq.errors import ConfigError, InvalidJob, JobqError
from jobq.extras import require
from jobq.settings import Settings

if TYPE_CHECKING:
    from jobq.api.server import ApiServer
    from jobq.webhooks import HttpWebhookCaller

DEV_ALLOW_CIDRS = ("127.0.0.0/8", "::1/128")  # `jobq dev` may call webhooks on this machine


@click.command()
@click.option("--host", default=None, help="Interface to listen on [env JOBQ_API_HOST; 127.0.0.1].")
@click.option("--port", type=int, default=None, help="Port [env JOBQ_API_PORT; 8080].")
@click.option("--workers", type=int, default=None, help="Worker processes [env JOBQ_API_WORKERS; 1].")
@click.option("--log-level", default=None, help="DEBUG, INFO, WARNING [env JOBQ_LOG_LEVEL; INFO]")
@click.option("--log-format", type=click.Choice(["text", "json"]), default=None, help="Log format.")
@click.option(
    "--tracing",
    type=click.Choice(["auto", "console", "otlp", "off"]),
    default=None,
    help="OpenTelemetry spans [env JOBQ_TRACING; auto: the application's provider].",
)
@backend_options
def api(host: str | None, port: int | None, workers: int | None, **options: Any) -> None:
    """Serve the HTTP API (/v1/jobs, /v1/dlq, /healthz, /readyz, /metrics, /openapi.json).

    Rate limits are per worker process: with --workers N a tenant may submit N times the limit."""
    settings = load_settings({**options, "api_host": host, "api_port": port, "api_workers": workers})
    logs.configure(settings.log_level, settings.log_format)
    try:
        tracing.configure(settings.tracing, "jobq-api")
    except JobqError as exc:
        fail(str(exc))
    for module in ("fastapi", "uvicorn", "httpx"):
        require(module, "api", "the HTTP API")
    from jobq.api.server import serve
    from jobq.api.tokens import tenant_store
    from jobq.netpolicy import NetPolicy

    NetPolicy.from_settings(settings)  # a bad webhook_allow_cidrs is one line here, not one per worker
    with deployment(settings) as d:
        tenant_store(d)
    serve(settings)


@click.group()
def tokens() -> None:
    """Create, list and revoke HTTP API tokens (each belongs to one tenant)."""


@tokens.command("create")
@click.option("--tenant", "tenant_id", default=None, help="The tenant whose jobs the token may see and change.")
@click.option("--operator", is_flag=True, help="An operator token: sees and changes every tenant's jobs.")
@click.option("--name", default="", help="A label for listings, e.g. the client's name.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the token (for TOKEN=$(jobq tokens create ...)).")
@json_option
@backend_options
def create_token(tenant_id: str | None, operator: bool, name: str, quiet: bool, as_json: bool, **options: Any) -> None:
    """Create a token for one tenant (--tenant T) or an operator (--operator). It is shown once:
    only its SHA-256 is stored."""
    from jobq.api.tokens import issue_token, tenant_store

    if operator == (tenant_id is not None):
        fail("give either --tenant T (a tenant's token) or --operator (every tenant), not both or neither")
    with deployment(load_settings(options)) as d:
        try:
            record, secret = issue_token(tenant_store(d), tenant_id, d.clock.now_ms(), name)
        except InvalidJob as exc:
            fail(str(exc))
    if as_json:
        print_json(
            {
                "token_id": record.token_id,
                "tenant_id": record.scope,
                "operator": record.operator,
                "name": record.name,
                "token": secret,
            }
        )
    elif quiet:
        click.echo(secret)
    else:
        whom = "an operator (every tenant)" if record.operator else f"tenant {record.tenant_id}"
        click.echo(f"created {record.token_id} for {whom}; the token (shown once, keep it safe):")
        click.echo(secret)


@tokens.command("list")
@click.option("--tenant", "tenant_id", default=None, help="Only this tenant's tokens.")
@click.option("--operator", is_flag=True, help="Only operator tokens.")
@json_option
@backend_options
def list_tokens(tenant_id: str | None, operator: bool, as_json: bool, **options: Any) -> None:
    """List tokens (ids, tenants, names; never the secrets), oldest first. An operator token's
    tenant is `*` in the table (null with `operator: true` in --json)."""
    from jobq.api.tokens import tenant_store
    from jobq.models import OPERATOR_TENANT

    if operator and tenant_id is not None:
        fail("give --tenant T or --operator, not both")
    with reader(load_settings(options)) as d:
        found = tenant_store(d).list_tokens(OPERATOR_TENANT if operator else tenant_id)
    rows: list[dict[str, Any]] = [
        {
            "token_id": t.token_id,
            "tenant_id": t.scope,
            "operator": t.operator,
            "name": t.name,
            "created_at": ms_to_text(t.created_ms),
            "revoked_at": ms_to_text(t.revoked_ms) if t.revoked_ms is not None else None,
        }
        for t in found
    ]
    if as_json:
        print_json(rows)
        return
    out = new_table("token id", "tenant", "name", "created", "revoked")
    for t, row in zip(found, rows, strict=True):
        tenant = "* (operator)" if t.operator else t.tenant_id
        out.add_row(t.token_id, tenant, t.name, row["created_at"], row["revoked_at"] or "-")
    console.print(out)


@tokens.command("revoke")
@click.argument("token_id")
@backend_options
def revoke_token(token_id: str, **options: Any) -> None:
    """Revoke a token; requests with it are refused (401) from the next one on."""
    from jobq.api.tokens import tenant_store

    with deployment(load_settings(options)) as d:
        if not tenant_store(d).revoke_token(token_id, d.clock.now_ms()):
            fail(f"no active token {token_id!r} (see `jobq tokens list`)")
    click.echo(f"revoked {token_id}")


# -- helpers for `jobq dev` and `jobq worker` ---------------------------------------------------


def dev_settings(settings: Settings) -> Settings:
    """`jobq dev` lets webhooks reach this machine (127.0.0.0/8, ::1), so the examples work."""
    extra = [c for c in DEV_ALLOW_CIDRS if c not in settings.webhook_allow_cidrs]
    return settings.with_overrides(webhook_allow_cidrs=(*settings.webhook_allow_cidrs, *extra))


def webhook_caller(d: Deployment) -> HttpWebhookCaller | None:
    """The worker's HTTP webhook caller, or None (with a warning) when httpx is not installed or
    the store keeps no webhook secrets; webhook runs then wait for a worker that has one."""
    try:
        from jobq.api.tokens import tenant_store
        from jobq.webhooks import HttpWebhookCaller
    except ImportError:
        err_console.print("note: HTTP_WEBHOOK jobs need httpx: pip install 'jobq[api]'")
        return None
    try:
        return HttpWebhookCaller.from_deployment(
            d, tenant_store(d), max_connections=max(10, 2 * d.settings.concurrency)
        )
    except ConfigError as exc:
        err_console.print(f"note: no webhook caller: {exc}")
        return None


def dev_api(d: Deployment) -> tuple[ApiServer, str] | None:
    """The API server for `jobq dev` and a fresh token for tenant `default`, or None (with the
    reason printed) when the `api` extra is missing or the port is taken."""
    try:
        from jobq.api.server import ApiServer
        from jobq.api.tokens import issue_token, tenant_store
    except ImportError:
        err_console.print("note: the HTTP API is off: pip install 'jobq[api]' to serve it")
        return None
    try:
        server = ApiServer(d)
    except OSError as exc:
        where = f"{d.settings.api_host}:{d.settings.api_port}"
        err_console.print(f"warning: the HTTP API is off: cannot listen on {where} ({exc.strerror}); try --api-port")
        return None
    _record, secret = issue_token(tenant_store(d), "default", d.clock.now_ms(), name="jobq dev")
    return server, secret
