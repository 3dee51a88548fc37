"""The dashboard over plain HTTP: sign-in, session cookies, CSRF, tenancy, offline /docs.

What a person sees in a real browser is tested in test_ui_browser.py; these tests check what a
browser cannot show: cookie flags, refused forgeries, and what a hostile request gets.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from jobq.api.app import create_app
from jobq.api.server import ApiServer, listen
from jobq.api.tokens import issue_token, tenant_store
from jobq.client import Client
from jobq.deployment import Deployment
from jobq.models import JobKey, JobStatus, Priority, RetryPolicy, TaskInfo
from jobq.registry import DaemonRecord, Role, Running
from jobq.ui.cronwords import in_words
from jobq.ui.session import COOKIE, Sessions

from .conftest import Api
from .support import client_tls, wait_for

CRON_JOB = {
    "job_name": "nightly-report",
    "schedule_type": "CRON",
    "cron_expression": "30 2 * * *",
    "timezone": "America/New_York",
    "target": {"type": "TASK", "task": "reports.nightly"},
}


def _job(d: Deployment, tenant: str = "acme", **fields: Any) -> str:
    d.store.register_worker("w-test", ["reports.nightly"], ["default"], d.clock.now_ms())
    return Client(d, tenant_id=tenant).submit({**CRON_JOB, **fields}).job.job_id


def _browser(api: Api, **headers: str) -> httpx.Client:
    client = httpx.Client(
        base_url=api.url, headers=headers, follow_redirects=False, timeout=10, trust_env=False, verify=client_tls()
    )
    api._clients.append(client)
    return client


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, html
    return match[1]


def sign_in(api: Api, token: str, **headers: str) -> httpx.Client:
    browser = _browser(api, **headers)
    form = browser.get("/ui/login")
    response = browser.post("/ui/login", data={"csrf_token": _csrf(form.text), "token": token, "next": "/ui"})
    assert response.status_code == 303 and response.headers["location"] == "/ui", response.text
    return browser


def test_a_page_without_a_session_redirects_to_sign_in_and_back(api: Api) -> None:
    browser = _browser(api)
    response = browser.get("/ui/jobs?status=ACTIVE")
    assert response.status_code == 303
    assert response.headers["location"] == "/ui/login?next=%2Fui%2Fjobs%3Fstatus%3DACTIVE"


def test_signing_in_sets_an_httponly_samesite_strict_cookie_without_the_token(api: Api) -> None:
    token = api.token("acme")
    browser = _browser(api)
    form = browser.get("/ui/login")
    response = browser.post("/ui/login", data={"csrf_token": _csrf(form.text), "token": token, "next": "/ui/jobs"})
    assert response.status_code == 303 and response.headers["location"] == "/ui/jobs"
    cookie = next(c for c in response.headers.get_list("set-cookie") if c.startswith(COOKIE + "="))
    flags = {part.strip().lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/ui"} <= flags and "secure" not in flags
    assert token not in cookie
    assert browser.get("/ui/jobs").status_code == 200


def test_the_cookie_is_secure_behind_a_trusted_tls_proxy_only(
    serve_api: Callable[..., Api], make_deployment: Callable[..., Deployment]
) -> None:
    def cookie_flags(api: Api) -> set[str]:
        browser = _browser(api, **{"X-Forwarded-Proto": "https"})
        nonce = _csrf(browser.get("/ui/login").text)
        browser.cookies.clear()  # a Secure cookie is not sent over plain HTTP: send it as TLS would
        response = browser.post(
            "/ui/login",
            data={"csrf_token": nonce, "token": api.token("acme")},
            headers={"Cookie": f"jobq_signin={nonce}"},
        )
        cookie = next(c for c in response.headers.get_list("set-cookie") if c.startswith(COOKIE + "="))
        return {part.strip().lower() for part in cookie.split(";")[1:]}

    assert "secure" not in cookie_flags(serve_api(make_deployment()))
    assert "secure" in cookie_flags(serve_api(make_deployment(api_trust_forwarded_proto=True)))


def test_a_wrong_token_is_refused_on_the_form_with_a_401(api: Api) -> None:
    browser = _browser(api)
    form = browser.get("/ui/login")
    response = browser.post("/ui/login", data={"csrf_token": _csrf(form.text), "token": "jobq_" + "x" * 43})
    assert response.status_code == 401 and "unknown, revoked or malformed" in response.text
    assert COOKIE not in response.cookies


def test_sign_in_without_the_form_s_own_cookie_is_refused(api: Api) -> None:
    """A cross-site page cannot sign a victim in as someone else (login CSRF)."""
    response = _browser(api).post("/ui/login", data={"csrf_token": "made-up", "token": api.token("acme")})
    assert response.status_code == 403 and COOKIE not in response.cookies


def test_sign_in_never_redirects_off_the_dashboard(api: Api) -> None:
    browser = _browser(api)
    for target in ("https://evil.example/", "//evil.example/ui", "/v1/jobs"):
        form = browser.get("/ui/login")
        data = {"csrf_token": _csrf(form.text), "token": api.token("acme"), "next": target}
        assert browser.post("/ui/login", data=data).headers["location"] == "/ui"


def test_a_tampered_or_foreign_cookie_is_no_session(api: Api) -> None:
    browser = sign_in(api, api.token("acme"))
    value = browser.cookies[COOKIE]
    body, signature = value.split(".")
    for forged in (body + "." + "0" * len(signature), body[:-2] + "xx." + signature, "garbage"):
        browser.cookies.set(COOKIE, forged, path="/ui")
        assert browser.get("/ui").status_code == 303


def test_revoking_the_token_ends_its_sessions_at_once(api: Api) -> None:
    record, secret = issue_token(tenant_store(api.d), "acme", api.d.clock.now_ms())
    browser = sign_in(api, secret)
    assert browser.get("/ui").status_code == 200
    tenant_store(api.d).revoke_token(record.token_id, api.d.clock.now_ms())
    assert browser.get("/ui").status_code == 303


def test_a_session_works_on_every_api_process_of_the_deployment(api: Api) -> None:
    """The signing key lives in the store, so `jobq api --workers N` (and restarts) share sessions."""
    browser = sign_in(api, api.token("acme"))
    second = ApiServer(api.d, create_app(api.d), sock=listen("127.0.0.1", 0))
    thread, stop = second.start_thread()
    try:
        wait_for(lambda: second.started, 10, "the second API process")
        other = httpx.Client(
            base_url=second.url, cookies=browser.cookies, follow_redirects=False, trust_env=False, verify=client_tls()
        )
        with other:
            assert other.get("/ui").status_code == 200
    finally:
        stop.set()
        thread.join(15)


def test_an_action_without_the_csrf_token_or_from_another_origin_changes_nothing(api: Api) -> None:
    job_id = _job(api.d)
    browser = sign_in(api, api.token("acme"))
    page = browser.get(f"/ui/jobs/acme/{job_id}")
    good = _csrf(page.text)
    assert browser.post(f"/ui/jobs/acme/{job_id}/pause", data={}).status_code == 403
    assert browser.post(f"/ui/jobs/acme/{job_id}/pause", data={"csrf_token": "x" * 64}).status_code == 403
    foreign = browser.post(
        f"/ui/jobs/acme/{job_id}/pause", data={"csrf_token": good}, headers={"Origin": "https://evil.example"}
    )
    assert foreign.status_code == 403
    assert Client(api.d, tenant_id="acme").job(job_id).status is JobStatus.ACTIVE
    done = browser.post(f"/ui/jobs/acme/{job_id}/pause", data={"csrf_token": good}, headers={"Origin": api.url})
    assert done.status_code == 303 and done.headers["location"].endswith("?notice=pause")
    assert Client(api.d, tenant_id="acme").job(job_id).status is JobStatus.PAUSED


def test_cancel_asks_for_confirmation_first(api: Api) -> None:
    job_id = _job(api.d)
    browser = sign_in(api, api.token("acme"))
    csrf = _csrf(browser.get(f"/ui/jobs/acme/{job_id}").text)
    asked = browser.post(f"/ui/jobs/acme/{job_id}/cancel", data={"csrf_token": csrf})
    assert asked.status_code == 200 and "Yes, cancel the job" in asked.text
    assert Client(api.d, tenant_id="acme").job(job_id).status is JobStatus.ACTIVE
    done = browser.post(f"/ui/jobs/acme/{job_id}/cancel", data={"csrf_token": csrf, "confirm": "yes"})
    assert done.status_code == 303
    assert Client(api.d, tenant_id="acme").job(job_id).status is JobStatus.CANCELLED


def test_behind_a_trusted_proxy_the_origin_may_be_the_forwarded_host(
    serve_api: Callable[..., Api], make_deployment: Callable[..., Deployment]
) -> None:
    for trusted, expected in ((False, 403), (True, 303)):
        api = serve_api(make_deployment(api_trust_forwarded_proto=trusted))
        job_id = _job(api.d)
        browser = sign_in(api, api.token("acme"))
        csrf = _csrf(browser.get(f"/ui/jobs/acme/{job_id}").text)
        proxied = {"Origin": "https://jobq.example.com", "X-Forwarded-Host": "jobq.example.com"}
        response = browser.post(f"/ui/jobs/acme/{job_id}/pause", data={"csrf_token": csrf}, headers=proxied)
        assert response.status_code == expected


def test_another_session_s_csrf_token_is_refused(api: Api) -> None:
    job_id = _job(api.d)
    first, second = sign_in(api, api.token("acme")), sign_in(api, api.token("acme"))
    stolen = _csrf(first.get("/ui").text)
    refused = second.post(f"/ui/jobs/acme/{job_id}/cancel", data={"csrf_token": stolen, "confirm": "yes"})
    assert refused.status_code == 403


def test_a_tenant_cannot_see_or_change_another_tenant_s_job(api: Api) -> None:
    job_id = _job(api.d, tenant="acme")
    other = sign_in(api, api.token("globex"))
    assert job_id not in other.get("/ui/jobs").text
    assert other.get(f"/ui/jobs/acme/{job_id}").status_code == 404
    assert other.get("/ui/jobs", params={"tenant": "acme"}).text.count(job_id) == 0  # tenant is ignored for them
    csrf = _csrf(other.get("/ui").text)
    refused = other.post(f"/ui/jobs/acme/{job_id}/cancel", data={"csrf_token": csrf, "confirm": "yes"})
    assert refused.status_code == 404
    assert Client(api.d, tenant_id="acme").job(job_id).status is JobStatus.ACTIVE


def test_an_operator_session_sees_every_tenant_and_narrows_to_one(api: Api) -> None:
    a_job, b_job = _job(api.d, tenant="acme"), _job(api.d, tenant="globex")
    _record, secret = issue_token(tenant_store(api.d), None, api.d.clock.now_ms(), name="ops")
    operator = sign_in(api, secret)
    listing = operator.get("/ui/jobs").text
    assert a_job in listing and b_job in listing and "operator · all tenants" in listing
    narrowed = operator.get("/ui/jobs", params={"tenant": "globex"}).text
    assert b_job in narrowed and a_job not in narrowed
    assert operator.get(f"/ui/jobs/acme/{a_job}").status_code == 200


def test_jobs_are_listed_newest_first_and_filtered_by_task_status_and_name(api: Api) -> None:
    d = api.d
    d.store.register_worker("w-test", ["reports.nightly", "mail.send"], ["default"], d.clock.now_ms())
    client = Client(d, tenant_id="acme")

    def submit(**fields: Any) -> str:
        # Job ids sort by their millisecond of creation: let the clock move on between jobs.
        start = d.clock.now_ms()
        wait_for(lambda: d.clock.now_ms() > start, 5, "the clock to move")
        return client.submit({**CRON_JOB, **fields}).job.job_id

    older = submit(job_name="report-old")
    mail_id = submit(job_name="mail-digest", target={"type": "TASK", "task": "mail.send"})
    newer = submit(job_name="report-new")
    client.pause(JobKey("acme", older))
    browser = sign_in(api, api.token("acme"))
    text = browser.get("/ui/jobs").text
    assert text.index(newer) < text.index(mail_id) < text.index(older)
    by_task = browser.get("/ui/jobs", params={"task": "mail.send"}).text
    assert mail_id in by_task and newer not in by_task and older not in by_task
    paused = browser.get("/ui/jobs", params={"status": "PAUSED"}).text
    assert older in paused and newer not in paused
    named = browser.get("/ui/jobs", params={"name": "report-"}).text
    assert older in named and newer in named and mail_id not in named
    assert browser.get("/ui/jobs", params={"status": "NOPE"}).status_code == 400


def test_a_job_page_shows_its_schedule_in_words_and_next_fires_with_dst_notes(api: Api) -> None:
    job_id = _job(api.d, cron_expression="30 2 * * *", timezone="America/New_York")
    browser = sign_in(api, api.token("acme"))
    page = browser.get(f"/ui/jobs/acme/{job_id}").text
    assert "at 02:30 every day (America/New_York)" in page and "<code>30 2 * * *</code>" in page
    assert page.count("<time datetime=") == 10
    # Sundays of March at 02:30: one of them falls in the spring-forward gap every year.
    in_the_gap = _job(api.d, cron_expression="30 2 * 3 0", timezone="America/New_York")
    page = browser.get(f"/ui/jobs/acme/{in_the_gap}").text
    assert "<strong>skipped</strong>" in page and "DST: " in page and "did not happen" in page


def test_dashboard_pages_forbid_framing_inline_script_and_other_origins(api: Api) -> None:
    response = _browser(api).get("/ui/login")
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert response.headers["x-frame-options"] == "DENY"
    assert "<script>" not in response.text and "style=" not in response.text


def test_docs_and_redoc_load_their_assets_from_this_server(api: Api) -> None:
    browser = _browser(api)
    for page in ("/docs", "/redoc"):
        html = browser.get(page).text
        sources = re.findall(r'(?:src|href)="([^"]+)"', html)
        assert sources and all(s.startswith("/") for s in sources), sources
        for source in sources:
            if not source.endswith(".json"):
                asset = browser.get(source)
                assert asset.status_code == 200 and len(asset.content) > 100, source


def test_form_bodies_are_accepted_by_the_dashboard_only(api: Api) -> None:
    response = api.client(api.token("acme")).post(
        "/v1/jobs", content=b"a=1", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert response.status_code == 415


def test_the_session_key_is_made_once_per_deployment(deployment: Deployment) -> None:
    first = Sessions(tenant_store(deployment), 60).key
    assert Sessions(tenant_store(deployment), 60).key == first and len(first) >= 32


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("0 2 1 * *", "at 02:00 on day 1 of the month (UTC)"),
        ("*/15 * * * *", "every 15 minutes (UTC)"),
        ("30 9 * * 1-5", "at 09:30 on Monday to Friday (UTC)"),
        ("0 * * * *", "every hour, on the hour (UTC)"),
        ("5 4 * 1,7 0", "at 04:05 on Sunday in January and July (UTC)"),
        ("0 0 1 * 1", "at 00:00 on day 1 of the month or on Monday (UTC)"),
        ("*/10 * * * * *", "every 10 seconds (UTC)"),
    ],
)
def test_a_cron_expression_in_words(expression: str, words: str) -> None:
    assert in_words(expression) == words


def _daemon(d: Deployment, role: Role, daemon_id: str, **fields: Any) -> DaemonRecord:
    now = d.clock.now_ms()
    record = DaemonRecord(daemon_id, role, "host-1", 4242, "0.1.0", now - 60_000, now, **fields)
    d.registry.heartbeat([record], 30_000)
    return record


def test_the_daemons_page_lists_live_daemons_and_warns_of_missing_roles(api: Api) -> None:
    running = (
        Running("acme/job_a:1", "reports.nightly", 1, api.d.clock.now_ms() - 5_000),
        Running("globex/job_b:1", "mail.send", 2, api.d.clock.now_ms() - 1_000),
    )
    _daemon(api.d, Role.WORKER, "worker-1", queues=("default",), pool="threads", concurrency=4, busy=2, free=2,
            running=running, last_error="boom from globex's task", last_error_ms=api.d.clock.now_ms())  # fmt: skip
    tenant = sign_in(api, api.token("acme"))
    page = tenant.get("/ui/daemons").text
    assert "worker-1" in page and "2/2/0" in page
    assert "No live scanner, beat, reaper" in page  # delayed and cron jobs will not run
    assert "acme/job_a:1" in page and "globex/job_b:1" not in page and "boom" not in page
    _record, secret = issue_token(tenant_store(api.d), None, api.d.clock.now_ms(), name="ops")
    operator_page = sign_in(api, secret).get("/ui/daemons").text
    assert "globex/job_b:1" in operator_page and "boom from globex" in operator_page
    for role in (Role.SCANNER, Role.BEAT, Role.REAPER):
        _daemon(api.d, role, f"{role.value}-1")
    assert "will not run" not in tenant.get("/ui/daemons").text


def test_an_operator_overview_shows_the_census_backlog_and_live_daemons(api: Api) -> None:
    _job(api.d, tenant="acme")
    _daemon(api.d, Role.WORKER, "worker-1")
    _record, secret = issue_token(tenant_store(api.d), None, api.d.clock.now_ms(), name="ops")
    page = sign_in(api, secret).get("/ui").text
    assert "Every run, counted by the store." in page and "Dispatch per tier" in page
    assert "No live scanner, beat, reaper" in page and "live daemons" in page
    tenant_page = sign_in(api, api.token("acme")).get("/ui").text
    assert "Dispatch per tier" not in tenant_page and "Of the newest" in tenant_page


def test_the_tasks_page_shows_the_catalogue_with_each_task_s_declaration(api: Api) -> None:
    now = api.d.clock.now_ms()
    declared = TaskInfo(
        name="billing.aggregate",
        priority=Priority.HIGH,
        retry=RetryPolicy(max_retries=5),
        timeout_s=90,
        queue="high",
        parameters=("cycle: str",),
        worker_id="worker-7",
        published_ms=now,
    )
    api.d.store.publish_tasks([declared])
    _job(api.d)  # registers reports.nightly without a declaration, and uses it
    page = sign_in(api, api.token("acme")).get("/ui/tasks").text
    assert "<code>billing.aggregate</code>" in page and "<code>cycle: str</code>" in page
    assert "high, high" in page and "up to 5" in page and "1 min 30 s" in page and "worker-7" in page
    assert "<code>reports.nightly</code>" in page and "publishes no declaration" in page
    assert '<a href="/ui/jobs?task=reports.nightly" aria-label="Jobs of reports.nightly">1</a>' in page
