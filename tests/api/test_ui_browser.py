"""The dashboard in a real browser: Debian's Chromium, headless, driven by Playwright.

Playwright's Python package drives the system Chromium (`executable_path`); no browser is ever
downloaded. Without Chromium or Playwright these tests skip locally and fail under CI=true
(`.ci/run` installs Chromium with apt-get). Every request the browser makes to anything but the
API under test is refused and recorded, so the pages are proven to work offline. Each test saves
a screenshot of every page it visits in its tmp dir.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jobq.api.tokens import issue_token, tenant_store
from jobq.client import Client
from jobq.deployment import Deployment
from jobq.models import JobKey
from jobq.registry import DaemonRecord, Role

from .conftest import Api
from .support import Receiver, Reply, drive, webhook_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CHROMIUM = ("chromium", "chromium-browser")
PHONE = {"width": 390, "height": 844}
NO_WAIT = {"max_retries": 0, "initial_interval_sec": 0, "max_interval_sec": 0}


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"browser tests cannot run in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = next((p for p in map(shutil.which, CHROMIUM) if p), None)
    if path is None:
        _missing("no system Chromium (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[dev]')")
    with sync_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        launched = p.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox", "--disable-gpu"])
        yield launched
        launched.close()


class Visit:
    """One browser context against the API: offline (anything else is refused and recorded), with a
    screenshot of every page it is asked to keep."""

    def __init__(self, browser: Any, api: Api, shots: Path, name: str, **context: Any) -> None:
        self.api = api
        self.shots = shots
        self.name = name
        self.outside: list[str] = []
        self.errors: list[str] = []
        self.expected_404s = 0  # pages a test opens knowing they answer 404 (the console reports each)
        self.context = browser.new_context(base_url=api.url, **context)
        self.context.route("**/*", self._only_local)
        self.page = self.context.new_page()
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.on(
            "console", lambda m: self.errors.append(f"{m.text} ({self.page.url})") if m.type == "error" else None
        )
        self.page.set_default_timeout(15_000)

    def _only_local(self, route: Any) -> None:
        if route.request.url.startswith(self.api.url):
            route.continue_()
        else:
            self.outside.append(route.request.url)
            route.abort()

    def go(self, path: str) -> Any:
        response = self.page.goto(path)
        self.page.wait_for_load_state("networkidle")
        return response

    def shot(self, label: str) -> Path:
        path = self.shots / f"{self.name}-{label}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def sign_in(self, token: str) -> None:
        self.go("/ui")
        assert "/ui/login" in self.page.url
        self.page.get_by_label("API token").fill(token)
        self.page.get_by_role("button", name="Sign in").click()
        self.page.wait_for_url("**/ui")

    def close(self) -> None:
        self.context.close()
        assert self.outside == [], f"the page reached outside the server: {self.outside}"
        errors = [e for e in self.errors if "status of 404" not in e]
        assert errors == [] and len(self.errors) - len(errors) == self.expected_404s, self.errors


@pytest.fixture
def visit(browser: Any, tmp_path: Path) -> Iterator[Callable[..., Visit]]:
    opened: list[Visit] = []

    def open_visit(api: Api, name: str = "desktop", **context: Any) -> Visit:
        v = Visit(browser, api, tmp_path, name, **context)
        opened.append(v)
        return v

    yield open_visit
    for v in opened:
        v.close()


@pytest.fixture
def local_api(serve_api: Callable[..., Api], make_deployment: Callable[..., Deployment]) -> Api:
    return serve_api(make_deployment(webhook_allow_cidrs=("127.0.0.0/8",)), resolver=None)


def _cron_job(d: Deployment, tenant: str, name: str) -> str:
    d.store.register_worker("w-ui", ["reports.nightly"], ["default"], d.clock.now_ms())
    spec = {
        "job_name": name,
        "schedule_type": "CRON",
        "cron_expression": "30 2 * * *",
        "timezone": "America/New_York",
        "target": {"type": "TASK", "task": "reports.nightly"},
    }
    return Client(d, tenant_id=tenant).submit(spec).job.job_id


def test_a_user_signs_in_walks_every_page_and_pauses_and_resumes_a_job(
    local_api: Api, visit: Callable[..., Visit], receiver: Callable[..., Receiver]
) -> None:
    d = local_api.d
    job_id = _cron_job(d, "acme", "nightly-report")
    refusing = receiver(Reply(400, b"bad input"))
    Client(d, tenant_id="acme").submit({**webhook_job(refusing.url, retry_policy=NO_WAIT), "job_name": "hook"})
    drive(d)
    now = d.clock.now_ms()
    d.registry.heartbeat(
        [DaemonRecord(f"{role.value}-ui", role, "host-1", 4242, "0.1.0", now, now) for role in Role], 30_000
    )
    v = visit(local_api)
    v.sign_in(local_api.token("acme"))
    page = v.page

    assert page.get_by_role("heading", name="Overview").is_visible()
    assert page.get_by_role("alert").count() == 0  # every role is alive: no warning
    assert page.locator(".tile").filter(has_text="dead letters").locator(".figure").inner_text() == "1"
    v.shot("overview")

    page.get_by_role("link", name="Jobs", exact=True).click()
    page.wait_for_url("**/ui/jobs")
    assert page.get_by_role("link", name="nightly-report").is_visible()
    page.get_by_label("Status").select_option("ACTIVE")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**/ui/jobs?status=ACTIVE**")
    v.shot("jobs")

    page.get_by_role("link", name="nightly-report").click()
    page.wait_for_url(f"**/ui/jobs/acme/{job_id}")
    assert page.get_by_text("at 02:30 every day (America/New_York)").is_visible()
    assert page.locator("ol.fires li").count() == 10
    v.shot("job")
    page.get_by_role("button", name="Pause").click()
    page.get_by_text("Paused.").wait_for()
    assert Client(d, tenant_id="acme").job(JobKey("acme", job_id)).status.value == "PAUSED"
    page.get_by_role("button", name="Resume").click()
    page.get_by_text("Resumed.").wait_for()
    page.get_by_role("button", name="Trigger").click()
    page.get_by_text("Triggered").wait_for()
    v.shot("job-after-actions")

    page.locator("table.list a[href^='/ui/runs/']").first.click()
    page.get_by_role("heading", name="Attempts").wait_for()
    assert page.get_by_text("Lease holder").is_visible()
    v.shot("run")

    for name, heading, label in (
        ("Dead letters", "Dead letters", "dlq"),
        ("Daemons", "Daemons", "daemons"),
        ("Tasks", "Tasks", "tasks"),
    ):
        page.get_by_role("link", name=name, exact=True).click()
        page.get_by_role("heading", name=heading, exact=True).wait_for()
        v.shot(label)
        if label == "daemons":
            assert page.get_by_text("worker-ui").is_visible() and page.get_by_text("scanner-ui").is_visible()
    assert page.get_by_text("reports.nightly").is_visible()

    v.go("/docs")
    page.locator(".swagger-ui .info .title").wait_for()
    assert "jobq" in page.locator(".swagger-ui .info .title").inner_text()
    v.shot("docs")

    v.go("/ui")
    page.get_by_role("button", name="Sign out").click()
    page.get_by_text("Signed out.").wait_for()
    v.go("/ui/jobs")
    assert "/ui/login" in page.url


def test_a_dead_letter_redriven_from_the_dashboard_succeeds(
    local_api: Api, visit: Callable[..., Visit], receiver: Callable[..., Receiver]
) -> None:
    d = local_api.d
    target = receiver(Reply(400, b"not yet"), Reply(200, b"done"))
    submitted = Client(d, tenant_id="acme").submit(
        {**webhook_job(target.url, retry_policy=NO_WAIT), "job_name": "hook"}
    )
    drive(d)
    v = visit(local_api)
    v.sign_in(local_api.token("acme"))
    page = v.page
    v.go("/ui/dlq")
    row = page.locator("tbody tr").filter(has_text=submitted.job.job_id)
    assert row.get_by_text("HTTP 400").count() >= 1
    v.shot("dlq-before")
    row.get_by_role("button", name="Redrive").click()
    page.get_by_role("heading", name="Redrive this dead letter?").wait_for()
    v.shot("dlq-confirm")
    page.get_by_role("button", name="Yes, redrive").click()
    page.get_by_text("Redriven: 1 run(s)").wait_for()
    assert page.get_by_text("The dead-letter list is empty.").is_visible()

    drive(d)  # a real scanner and worker pick the redriven run up
    v.go(f"/ui/jobs/acme/{submitted.job.job_id}")
    page.locator("table.list a[href^='/ui/runs/']").first.click()
    page.get_by_role("heading", name="Attempts").wait_for()
    assert page.locator("h1 .state").inner_text() == "SUCCEEDED"
    assert page.locator("table.list tbody tr").count() == 2  # attempt 1 failed, attempt 2 succeeded
    assert '"body": "done"' in page.locator("pre").last.inner_text()  # the webhook's answer, kept as the result
    v.shot("run-redriven")
    assert len(target.requests) == 2


def test_a_tenant_sees_only_its_jobs_and_an_operator_sees_every_tenant(
    local_api: Api, visit: Callable[..., Visit]
) -> None:
    d = local_api.d
    acme_job = _cron_job(d, "acme", "acme-report")
    globex_job = _cron_job(d, "globex", "globex-report")

    globex = visit(local_api, "globex")
    globex.sign_in(local_api.token("globex"))
    globex.go("/ui/jobs")
    assert globex.page.get_by_role("link", name="globex-report").is_visible()
    assert globex.page.get_by_role("link", name="acme-report").count() == 0
    globex.expected_404s = 1
    response = globex.go(f"/ui/jobs/acme/{acme_job}")
    assert response.status == 404 and globex.page.get_by_role("alert").is_visible()
    globex.shot("another-tenant-s-job")

    _record, secret = issue_token(tenant_store(d), None, d.clock.now_ms(), name="ops")
    operator = visit(local_api, "operator")
    operator.sign_in(secret)
    operator.go("/ui/jobs")
    assert operator.page.get_by_role("link", name="acme-report").is_visible()
    assert operator.page.get_by_role("link", name="globex-report").is_visible()
    operator.shot("jobs-every-tenant")
    operator.page.get_by_label("Tenant").fill("acme")
    operator.page.get_by_role("button", name="Filter").click()
    operator.page.wait_for_url("**tenant=acme**")
    assert operator.page.get_by_role("link", name="globex-report").count() == 0
    assert globex_job not in operator.page.content()


def test_the_dashboard_fits_a_phone_and_works_from_the_keyboard(local_api: Api, visit: Callable[..., Visit]) -> None:
    _cron_job(local_api.d, "acme", "nightly-report")
    v = visit(local_api, "phone", viewport=PHONE, is_mobile=True, has_touch=True)
    page = v.page
    v.go("/ui/login")
    assert page.evaluate("document.activeElement.id") == "token"  # the form starts in its field
    page.keyboard.type(local_api.token("acme"))
    page.keyboard.press("Enter")
    page.wait_for_url("**/ui")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    for path, label in (("/ui", "overview"), ("/ui/jobs", "jobs"), ("/ui/dlq", "dlq")):
        v.go(path)
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{path} is {overflow}px wider than a phone"
        v.shot(label)
    v.go("/ui/jobs")
    page.get_by_role("link", name="nightly-report").focus()
    page.keyboard.press("Enter")
    page.get_by_role("heading", name="Schedule").wait_for()
    assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
    v.shot("job")
