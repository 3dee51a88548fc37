"""The dashboard's routes: `/ui` pages rendered from Jinja2 templates over the same `Client` the API uses.

Every page needs a session (`jobq.ui.session`): without one, a page redirects to the sign-in form.
A session is confined to its token's tenant; an operator's sees every tenant and may narrow to one.
Every POST checks the session's CSRF token and, when the browser sends one, the `Origin` header.
Pages work without JavaScript; htmx (vendored, `hx-boost`) only makes navigation and the
overview's refresh smoother.
"""

from __future__ import annotations

import importlib.resources
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

import jinja2
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from jobq.api.routes import attempts
from jobq.api.state import ApiState, api_state
from jobq.api.tokens import authenticate
from jobq.client import Client
from jobq.cronpreview import preview
from jobq.errors import Conflict, InvalidQuery, JobNotFound, RunNotFound
from jobq.instants import to_iso
from jobq.models import ApiToken, JobKey, JobStatus, Run, RunEvent, ScheduleType, TaskTarget
from jobq.ports import JobQuery
from jobq.registry import SCHEDULING_ROLES
from jobq.results import read_result
from jobq.schedules import CronSchedule
from jobq.ui import figures
from jobq.ui.cronwords import in_words
from jobq.ui.session import COOKIE, CSRF_FIELD, LOGIN_COOKIE, Session, Sessions
from jobq.views import job_resource, redact_target

log = logging.getLogger("jobq.ui")
router = APIRouter(prefix="/ui", include_in_schema=False)

PAGE_SIZE = 50
RUNS_SHOWN = 50
HISTORY_SHOWN = 200
FIRES_SHOWN = 10
TASK_SCAN = 2000  # jobs read per page of a task-filtered listing (the store cannot filter by task)
STATIC = {
    "htmx.min.js": "text/javascript",
    "htmx.LICENSE.txt": "text/plain",
    "jobq.css": "text/css",
}
SECURITY_HEADERS = {
    # No inline script or style, nothing from elsewhere, no framing.
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
ACTIONS: dict[str, Callable[[Client, JobKey], object]] = {
    "pause": Client.pause,
    "resume": Client.resume,
    "cancel": Client.cancel,
    "trigger": Client.trigger,
}
NOTICES = {
    "pause": "Paused.",
    "resume": "Resumed.",
    "cancel": "Cancelled.",
    "trigger": "Triggered: a run was created now.",
    "signed-out": "Signed out.",
}


def when_text(ms: int | None) -> str:
    """An instant for people: `2026-12-01 10:32:27 UTC` (None: empty)."""
    if ms is None:
        return ""
    text = to_iso(ms)  # total: also years past 9999
    return text.replace("T", " ", 1).removesuffix("Z").rsplit(".", 1)[0] + " UTC"


def local_text(iso_local: str) -> str:
    """A preview's local ISO time for people: `Wed 2 Dec 2026, 02:30`."""
    try:
        moment = datetime.fromisoformat(iso_local)
    except ValueError:
        return iso_local
    seconds = f":{moment.second:02d}" if moment.second else ""
    return f"{moment:%a} {moment.day} {moment:%b %Y}, {moment:%H:%M}{seconds}"


def duration_text(ms: int | None) -> str:
    """`1234` -> "1.23 s"; `90_000` -> "1 min 30 s"; None -> "-"."""
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.3g} s"
    minutes, rest = divmod(ms // 1000, 60)
    if minutes < 60:
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("jobq.ui", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["iso"] = when_text
    env.filters["local"] = local_text
    env.filters["duration"] = duration_text
    env.filters["q"] = lambda value: quote(str(value), safe="")
    return env


TEMPLATES = _templates()


class _SignIn(Exception):
    """No valid session: send the browser to the sign-in form."""


@dataclass(frozen=True, slots=True)
class User:
    token: ApiToken
    session: Session
    csrf: str

    @property
    def scope(self) -> str | None:
        return self.token.scope


def _sessions(request: Request) -> Sessions:
    sessions = request.app.state.jobq_ui
    assert isinstance(sessions, Sessions)
    return sessions


def _user(request: Request) -> User:
    """The signed-in user of this request; raises `_SignIn` when there is none (or its token was revoked)."""
    state, sessions = api_state(request), _sessions(request)
    session = sessions.read(request.cookies.get(COOKIE), state.deployment.clock.now_ms())
    token = None if session is None else state.tenants.find_token(session.token_hash)
    if session is None or token is None or not token.active:
        raise _SignIn
    request.state.tenant_id = token.tenant_id  # for the access log
    return User(token, session, sessions.csrf(session))


def secure_request(request: Request) -> bool:
    """Whether the browser reached us over TLS: the request's own scheme, or a proxy's
    `X-Forwarded-Proto: https` when `api_trust_forwarded_proto` says to believe it."""
    if request.url.scheme == "https":
        return True
    trust = api_state(request).deployment.settings.api_trust_forwarded_proto
    return trust and request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower() == "https"


def _origin_ok(request: Request) -> bool:
    """A cross-site form post names another origin; browsers send `Origin` on every POST. It must
    name this server: its `Host`, or, behind a trusted proxy (`api_trust_forwarded_proto`), the
    host the proxy says the browser asked for (`X-Forwarded-Host`)."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    hosts = {request.headers.get("host", "")}
    if api_state(request).deployment.settings.api_trust_forwarded_proto:
        hosts.add(request.headers.get("x-forwarded-host", "").split(",")[0].strip())
    return urlsplit(origin).netloc in hosts - {""}


def render(request: Request, template: str, status: int = 200, user: User | None = None, **context: Any) -> Response:
    context.setdefault("page", None)
    html = TEMPLATES.get_template(template).render(request=request, user=user, csrf_field=CSRF_FIELD, **context)
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def _redirect(url: str) -> Response:
    return RedirectResponse(url, status_code=303, headers={"Cache-Control": "no-store"})


def _error_page(request: Request, user: User | None, status: int, message: str) -> Response:
    return render(request, "error.html", status, user, message=message)


async def _form(request: Request) -> dict[str, str]:
    """The urlencoded form of a POST (the first value of each field)."""
    body = (await request.body()).decode("utf-8", errors="replace")
    return {k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()}


async def _mutation(request: Request) -> tuple[User, dict[str, str]] | Response:
    """The user and form of a POST that changes something, or the response refusing it."""
    try:
        user = await run_in_threadpool(_user, request)  # reads the store: off the event loop
    except _SignIn:
        return _redirect("/ui/login")
    form = await _form(request)
    if not _origin_ok(request) or not _sessions(request).csrf_ok(user.session, form.get(CSRF_FIELD)):
        return _error_page(request, user, 403, "This form has expired or came from another site; reload the page.")
    return user, form


def _client(request: Request, user: User, tenant: str | None = None) -> Client:
    """The user's client, narrowed to `tenant` for an operator (a tenant's user is always its own)."""
    scope = user.scope if user.scope is not None else tenant or None
    return api_state(request).client(scope)


def install(app: FastAPI, state: ApiState) -> None:
    """Serve the dashboard from `app` (`/ui`), with its sessions kept in `state`'s token store."""
    app.state.jobq_ui = Sessions(state.tenants, state.deployment.settings.ui_session_ttl_s)
    app.include_router(router)

    @app.exception_handler(_SignIn)
    async def sign_in(request: Request, _exc: _SignIn) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return _redirect("/ui/login?" + urlencode({"next": target}))


# -- sign-in ------------------------------------------------------------------------------------


def _safe_next(target: str | None) -> str:
    """Only a path of the dashboard itself: never another site (an open redirect)."""
    if target and target.startswith("/ui") and not target.startswith("//") and "\\" not in target:
        return target
    return "/ui"


@router.get("/login")
def login_form(request: Request, next: str | None = None, notice: str | None = None) -> Response:
    nonce = Sessions.new_nonce()
    response = render(
        request, "login.html", next=_safe_next(next), nonce=nonce, error=None, notice=NOTICES.get(notice or "")
    )
    _login_cookie(request, response, nonce)
    return response


def _login_cookie(request: Request, response: Response, nonce: str) -> None:
    """The sign-in form's double-submit cookie (there is no session to tie a CSRF token to yet)."""
    response.set_cookie(
        LOGIN_COOKIE, nonce, max_age=600, httponly=True, samesite="strict", secure=secure_request(request), path="/ui"
    )


@router.post("/login")
async def login(request: Request) -> Response:
    form = await _form(request)
    target = _safe_next(form.get("next"))
    given_nonce, cookie_nonce = form.get(CSRF_FIELD), request.cookies.get(LOGIN_COOKIE)
    if not _origin_ok(request) or not given_nonce or given_nonce != cookie_nonce:
        return _error_page(request, None, 403, "The sign-in form expired; open it again.")
    state = api_state(request)
    token = await run_in_threadpool(authenticate, state.tenants, form.get("token", "").strip())
    if token is None:
        nonce = Sessions.new_nonce()
        response = render(
            request,
            "login.html",
            401,
            next=target,
            nonce=nonce,
            error="That token is unknown, revoked or malformed.",
            notice=None,
        )
        _login_cookie(request, response, nonce)
        return response
    sessions = _sessions(request)
    value, _session = await run_in_threadpool(sessions.issue, token.token_hash, state.deployment.clock.now_ms())
    response = _redirect(target)
    response.set_cookie(
        COOKIE,
        value,
        max_age=sessions.ttl_ms // 1000,
        httponly=True,
        samesite="strict",
        secure=secure_request(request),
        path="/ui",
    )
    response.delete_cookie(LOGIN_COOKIE, path="/ui")
    log.info("dashboard sign-in with token %s (tenant %s)", token.token_id, token.tenant_id)
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    checked = await _mutation(request)
    if isinstance(checked, Response):
        return checked
    response = _redirect("/ui/login?notice=signed-out")
    response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict", secure=secure_request(request))
    return response


# -- static files -------------------------------------------------------------------------------


@router.get("/static/{name}")
def static(name: str) -> Response:
    media_type = STATIC.get(name)
    if media_type is None:
        return Response("not found", status_code=404, media_type="text/plain")
    body = (importlib.resources.files("jobq.ui") / "static" / name).read_bytes()
    return Response(body, media_type=media_type, headers={"Cache-Control": "public, max-age=3600"})


# -- pages --------------------------------------------------------------------------------------


@router.get("")
def overview_page(request: Request, tenant: str | None = None) -> Response:
    user = _user(request)
    client = _client(request, user, tenant)
    now = client.clock.now_ms()
    try:
        shown = figures.overview(client, now)
    except InvalidQuery as exc:
        return _error_page(request, user, 400, str(exc))
    return render(request, "overview.html", user=user, page="overview", o=shown, tenant=client.tenant_id)


@router.get("/jobs")
def jobs_page(
    request: Request,
    status: str | None = None,
    task: str | None = None,
    name: str | None = None,
    tenant: str | None = None,
    cursor: str | None = None,
) -> Response:
    user = _user(request)
    client = _client(request, user, tenant)
    try:
        chosen = JobStatus(status) if status else None
    except ValueError:
        return _error_page(request, user, 400, f"unknown status {status!r}")
    filters = {"status": status or "", "task": task or "", "name": name or "", "tenant": tenant or ""}
    try:
        jobs, next_cursor = _jobs(client, chosen, task or None, name or None, cursor or None)
    except (InvalidQuery, Conflict) as exc:
        return _error_page(request, user, 400, str(exc))
    next_url = None
    if next_cursor is not None:
        next_url = "/ui/jobs?" + urlencode({**{k: v for k, v in filters.items() if v}, "cursor": next_cursor})
    return render(
        request,
        "jobs.html",
        user=user,
        page="jobs",
        jobs=jobs,
        filters=filters,
        statuses=[s.value for s in JobStatus],
        next_url=next_url,
        task_of=lambda job: job.target.task if isinstance(job.target, TaskTarget) else "(webhook)",
    )


def _jobs(
    client: Client, status: JobStatus | None, task: str | None, name: str | None, cursor: str | None
) -> tuple[list[Any], str | None]:
    """A page of jobs, newest first. The store filters by status and name prefix; a task filter is
    applied here to at most `TASK_SCAN` jobs per page (the page then says where it stopped)."""
    if task is None:
        page = client.list(JobQuery(status=status, name_prefix=name, cursor=cursor, limit=PAGE_SIZE, newest_first=True))
        return page.items, page.next_cursor
    found: list[Any] = []
    scanned = 0
    while len(found) < PAGE_SIZE and scanned < TASK_SCAN:
        page = client.list(JobQuery(status=status, name_prefix=name, cursor=cursor, limit=500, newest_first=True))
        for job in page.items:
            scanned += 1
            if isinstance(job.target, TaskTarget) and job.target.task == task:
                found.append(job)
        cursor = page.next_cursor
        if cursor is None:
            break
    return found, cursor


@router.get("/jobs/{tenant}/{job_id}")
def job_page(request: Request, tenant: str, job_id: str, notice: str | None = None) -> Response:
    user = _user(request)
    client = _client(request, user, tenant)
    key = JobKey(tenant, job_id)
    try:
        view = client.get(key)
        runs = client.runs(key, limit=RUNS_SHOWN).items
        events = client.history(key, limit=HISTORY_SHOWN)
    except (JobNotFound, InvalidQuery):
        return _error_page(request, user, 404, f"No job {job_id!r} in tenant {tenant!r} that you can see.")
    job = view.job
    fires: list[dict[str, Any]] = []
    words = None
    if job.schedule.type is ScheduleType.CRON and job.schedule.cron and job.corrupt is None:
        words = in_words(job.schedule.cron, job.schedule.timezone)
        if job.status is JobStatus.ACTIVE:
            schedule = CronSchedule(
                job.schedule.cron,
                job.schedule.timezone,
                dst_gap=job.schedule.dst_gap,
                dst_overlap=job.schedule.dst_overlap,
            )
            fires = [e.resource(schedule) for e in preview(schedule, client.clock.now_ms(), FIRES_SHOWN)]
    elif job.schedule.type is ScheduleType.ONE_OFF:
        words = f"once, at {to_iso(job.schedule.at_ms)}" if job.schedule.at_ms is not None else "once"
    elif job.schedule.type is ScheduleType.IMMEDIATE:
        words = "once, as soon as it was submitted"
    return render(
        request,
        "job.html",
        user=user,
        page="jobs",
        job=job,
        resource=job_resource(view),
        target=redact_target(job.target),
        words=words,
        fires=fires,
        runs=runs,
        timeline=_timeline(runs),
        events=events,
        notice=NOTICES.get(notice or ""),
        actions=_allowed_actions(job.status),
        lateness=figures.lateness_ms,
    )


def _allowed_actions(status: JobStatus) -> list[str]:
    return {
        JobStatus.ACTIVE: ["pause", "trigger", "cancel"],
        JobStatus.PAUSED: ["resume", "trigger", "cancel"],
        JobStatus.COMPLETED: ["trigger"],
        JobStatus.QUARANTINED: ["cancel"],
    }.get(status, [])


def _timeline(runs: list[Run]) -> list[dict[str, Any]]:
    """Each run's place (0..1) between the oldest and newest nominal time shown, for the SVG strip."""
    if not runs:
        return []
    first, last = min(r.nominal_ms for r in runs), max(r.nominal_ms for r in runs)
    span = max(1, last - first)
    return [
        {
            "x": 0.5 if last == first else (r.nominal_ms - first) / span,
            "run": r,
            "late": figures.lateness_ms(r.due_ms, r.started_ms),
        }
        for r in runs
    ]


@router.post("/jobs/{tenant}/{job_id}/{action}")
async def job_action(request: Request, tenant: str, job_id: str, action: str) -> Response:
    checked = await _mutation(request)
    if isinstance(checked, Response):
        return checked
    user, form = checked
    act = ACTIONS.get(action)
    if act is None:
        return _error_page(request, user, 404, f"No action {action!r}.")
    client = _client(request, user, tenant)
    key = JobKey(tenant, job_id)
    if action == "cancel" and form.get("confirm") != "yes":  # the one action that cannot be undone
        return render(request, "confirm_cancel.html", user=user, page="jobs", tenant=tenant, job_id=job_id)
    try:
        await run_in_threadpool(act, client, key)
    except JobNotFound:
        return _error_page(request, user, 404, f"No job {job_id!r} in tenant {tenant!r} that you can see.")
    except Conflict as exc:
        return _error_page(request, user, 409, str(exc))
    log.info("dashboard: %s of %s by token %s", action, key, user.token.token_id)
    return _redirect(f"/ui/jobs/{quote(tenant, safe='')}/{quote(job_id, safe='')}?notice={action}")


@router.get("/runs/{run_id:path}")
def run_page(request: Request, run_id: str) -> Response:
    user = _user(request)
    client = _client(request, user)
    try:
        run = client.run(run_id)
        events: list[RunEvent] = [e for e in client.history(run.job_key, limit=10_000) if e.run_id == run_id]
    except (RunNotFound, JobNotFound, InvalidQuery):
        return _error_page(request, user, 404, f"No run {run_id!r} that you can see.")
    return render(
        request,
        "run.html",
        user=user,
        page="jobs",
        run=run,
        attempts=attempts(events),
        events=events,
        lateness=figures.lateness_ms(run.due_ms, run.started_ms),
        outcome=read_result(run, client.clock.now_ms(), client.d.settings.result_ttl_s),
    )


@router.get("/dlq")
def dlq_page(
    request: Request, tenant: str | None = None, cursor: str | None = None, notice: str | None = None
) -> Response:
    user = _user(request)
    client = _client(request, user, tenant)
    try:
        page = client.dead_letters(cursor=cursor or None, limit=PAGE_SIZE)
    except (InvalidQuery, Conflict) as exc:
        return _error_page(request, user, 400, str(exc))
    next_url = None
    if page.next_cursor is not None:
        next_url = "/ui/dlq?" + urlencode({**({"tenant": tenant} if tenant else {}), "cursor": page.next_cursor})
    return render(
        request,
        "dlq.html",
        user=user,
        page="dlq",
        runs=page.items,
        next_url=next_url,
        tenant=tenant or "",
        notice=notice if notice in ("redriven", "purged") else None,
        count=request.query_params.get("count", ""),
    )


@router.post("/dlq/{what}")
async def dlq_action(request: Request, what: str) -> Response:
    """Redrive or purge one dead letter (`run_id`) or all in scope (`all=1`). Without
    `confirm=yes` this answers the confirmation page, whose button posts again with it."""
    checked = await _mutation(request)
    if isinstance(checked, Response):
        return checked
    user, form = checked
    if what not in ("redrive", "purge"):
        return _error_page(request, user, 404, f"No dead-letter action {what!r}.")
    tenant = form.get("tenant") or None
    client = _client(request, user, tenant)
    run_id = form.get("run_id") or None
    everything = form.get("all") == "1"
    if run_id is None and not everything:
        return _error_page(request, user, 400, "Choose a run, or all dead letters.")
    if form.get("confirm") != "yes":
        return render(
            request,
            "confirm.html",
            user=user,
            page="dlq",
            what=what,
            run_id=run_id,
            everything=everything,
            tenant=tenant or "",
            scope=client.tenant_id,
        )
    try:
        if what == "redrive":
            done = await run_in_threadpool(_redrive, client, None if everything else run_id)
        else:
            done = await run_in_threadpool(client.purge, None if everything else [run_id or ""])
    except RunNotFound:
        return _error_page(request, user, 404, f"No run {run_id!r} that you can see.")
    except Conflict as exc:
        return _error_page(request, user, 409, str(exc))
    log.info("dashboard: %s of %d dead letter(s) by token %s", what, done, user.token.token_id)
    back = {"notice": "redriven" if what == "redrive" else "purged", "count": str(done)}
    if tenant:
        back["tenant"] = tenant
    return _redirect("/ui/dlq?" + urlencode(back))


def _redrive(client: Client, run_id: str | None) -> int:
    if run_id is not None:
        client.redrive(run_id)
        return 1
    done = 0
    while True:
        page = client.dead_letters(limit=500)
        if not page.items:
            return done
        for run in page.items:
            try:
                client.redrive(run.run_id)
                done += 1
            except Conflict:
                continue  # it moved meanwhile (redriven or purged by someone else)
        if page.next_cursor is None and len(page.items) < 500:
            return done


@router.get("/daemons")
def daemons_page(request: Request) -> Response:
    user = _user(request)
    d = api_state(request).deployment
    now = d.clock.now_ms()
    records = d.registry.live_daemons(now)
    alive = {r.role for r in records}
    return render(
        request,
        "daemons.html",
        user=user,
        page="daemons",
        daemons=figures.visible_daemons(records, user.scope),
        missing=[role.value for role in SCHEDULING_ROLES if role not in alive],
        now_ms=now,
    )


@router.get("/tasks")
def tasks_page(request: Request, tenant: str | None = None) -> Response:
    user = _user(request)
    client = _client(request, user, tenant)
    rows = figures.task_rows(client)
    return render(request, "tasks.html", user=user, page="tasks", tasks=rows, jobs_read=figures.TASK_JOBS_READ)
