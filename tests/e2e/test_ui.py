"""The web UI end to end: headless Chromium (Debian's, driven by playwright) against the whole
system. Batches are submitted over the REST API; every page is visited through the browser
after logging in with a token, and each page's test saves a screenshot (``HS_SCREENSHOT_DIR``,
default ``var/screenshots/``).

Playwright's sync API runs its own event loop, so nothing here calls ``asyncio.run`` while the
browser is open: the world (users, batches) is built before the browser starts.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

from schemas.control import (
    BillingProjectCreated,
    BillingProjectMemberAdded,
    TokenIssued,
    UserCreated,
)
from services.ingest.admin import new_token
from services.ingest.store import User
from services.ingest.ui import routes, views
from services.ingest.ui.views import usd

from .conftest import REPO, System, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SHOTS = Path(os.environ.get("HS_SCREENSHOT_DIR") or REPO / "var" / "screenshots")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
LOG_LINE = "hello from the ui job"


def api(system: System, method: str, path: str, body: Any = None, *,
        token: str | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{system.url}/api/v1alpha{path}", data=data, method=method,
        headers={"Authorization": f"Bearer {token or system.token}",
                 "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def job_spec(job_id: int, command: list[str], name: str, group: int = 0) -> dict[str, Any]:
    return {"job_id": job_id, "in_update_job_group_id": group, "attributes": {"name": name},
            "process": {"type": "docker", "image": "ubuntu:24.04", "command": command,
                        "mount_docker_socket": False}}


def create_fast(system: System, name: str, jobs: list[dict[str, Any]],
                groups: list[dict[str, Any]] | None = None, *, project: str = "e2e",
                token: str | None = None, attributes: dict[str, str] | None = None) -> int:
    body = {"batch": {"billing_project": project, "n_jobs": len(jobs),
                      "n_job_groups": len(groups or []), "token": uuid.uuid4().hex,
                      "attributes": {"name": name, **(attributes or {})}},
            "job_groups": groups or [], "bunch": jobs}
    return int(api(system, "POST", "/batches/create-fast", body, token=token)["id"])


@dataclass
class World:
    system: System
    tree: int  # complete: jobs in the root, in group alpha and in alpha's child beta
    sleeper: int  # a job sleeping (Running) until the cancel test cancels it
    secret: int  # the outsider's batch, in a project tester is not a member of
    cancelled: int  # cancelled over the API while its job waited
    outsider_token: str


@pytest.fixture(scope="module")
def world(running_system: System) -> World:
    s = running_system
    token, token_id, digest = new_token()
    s.append([UserCreated(user="outsider"),
              TokenIssued(user="outsider", token_id=token_id, token_sha256=digest),
              BillingProjectCreated(billing_project="hidden"),
              BillingProjectMemberAdded(billing_project="hidden", user="outsider")])
    tree = create_fast(
        s, "ui-tree",
        [job_spec(1, ["echo", LOG_LINE], "greeter"),
         job_spec(2, ["true"], "alpha-job", group=1),
         job_spec(3, ["false"], "beta-job", group=2)],
        [{"job_group_id": 1, "absolute_parent_id": 0, "attributes": {"name": "alpha"}},
         {"job_group_id": 2, "in_update_parent_id": 1, "attributes": {"name": "beta"}}])
    sleeper = create_fast(s, "ui-sleeper", [job_spec(1, ["sleep", "600"], "sleepy")])
    secret = create_fast(s, "ui-secret", [], project="hidden", token=token)
    cancelled = create_fast(s, "ui-cancelled", [job_spec(1, ["sleep", "600"], "doomed")])
    api(s, "PATCH", f"/batches/{cancelled}/cancel")
    wait_for("the tree batch to complete",
             lambda: api(s, "GET", f"/batches/{tree}")["complete"], timeout=180)
    wait_for("the sleeper to run",
             lambda: api(s, "GET", f"/batches/{sleeper}/jobs/1")["state"] == "Running",
             timeout=180)
    return World(system=s, tree=tree, sleeper=sleeper, secret=secret, cancelled=cancelled,
                 outsider_token=token)


@pytest.fixture(scope="module")
def browser(world: World) -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def login(browser: Browser, system: System, token: str) -> BrowserContext:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.goto(f"{system.url}/ui/login")
    page.fill("#token", token)
    page.click("#login")
    page.wait_for_url(re.compile(r".*/ui/batches.*"))
    page.close()
    return context


@pytest.fixture(scope="module")
def tester(browser: Browser, world: World) -> Iterator[BrowserContext]:
    context = login(browser, world.system, world.system.token)
    yield context
    context.close()


@pytest.fixture
def page(tester: BrowserContext) -> Iterator[Page]:
    p = tester.new_page()
    yield p
    p.close()


def shoot(page: Page, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.exists() and path.stat().st_size > 10_000, path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return path


# --- login, sessions, CSRF, visibility -----------------------------------------------------------
def test_unauthenticated_pages_redirect_to_login(browser: Browser, world: World) -> None:
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{world.system.url}/ui/batches/{world.tree}")
        assert "/ui/login?next=" in page.url and f"%2Fui%2Fbatches%2F{world.tree}" in page.url
        expect(page.locator("h1")).to_have_text("Log in")
        shoot(page, "login_page")
        page.goto(f"{world.system.url}/ui")
        assert page.url.endswith("/ui/login?next=%2Fui%2Fbatches")
        css = context.request.get(f"{world.system.url}/ui/static/ui.css")
        assert css.ok and "text/css" in css.headers["content-type"]
    finally:
        context.close()


def test_wrong_token_shows_an_error_and_a_good_one_returns_to_next(browser: Browser,
                                                                    world: World) -> None:
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{world.system.url}/ui/batches/{world.tree}")
        page.fill("#token", "not-a-token")
        with page.expect_response(re.compile(r".*/ui/login$")) as answer:
            page.click("#login")
        assert answer.value.status == 401
        expect(page.locator("#login-error")).to_have_text("Unknown, expired or revoked token.")
        assert not [c for c in context.cookies() if c["name"] == "hs_session"]
        page.fill("#token", world.system.token)
        page.click("#login")
        page.wait_for_url(f"{world.system.url}/ui/batches/{world.tree}")
        (cookie,) = [c for c in context.cookies() if c["name"] == "hs_session"]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Lax" and cookie["path"] == "/ui"
    finally:
        context.close()


def test_posts_without_csrf_are_forbidden(tester: BrowserContext, world: World) -> None:
    url = f"{world.system.url}/ui/batches/{world.sleeper}/cancel"
    missing = tester.request.post(url, form={}, max_redirects=0)
    wrong = tester.request.post(url, form={"_csrf": "0" * 64}, max_redirects=0)
    assert (missing.status, wrong.status) == (403, 403)
    assert "CSRF" in missing.text()
    logout = tester.request.post(f"{world.system.url}/ui/logout", form={}, max_redirects=0)
    assert logout.status == 403  # still logged in: the next request works
    assert api(world.system, "GET", f"/batches/{world.sleeper}")["state"] == "running"


def test_login_form_needs_its_own_cookie(browser: Browser, world: World) -> None:
    context = browser.new_context()
    try:  # a cross-site login POST carries no login cookie
        answer = context.request.post(f"{world.system.url}/ui/login", max_redirects=0,
                                      form={"token": world.system.token, "_login": "forged"})
        assert answer.status == 403
        assert not [c for c in context.cookies() if c["name"] == "hs_session"]
    finally:
        context.close()


def test_users_cannot_see_other_users_batches(page: Page, world: World) -> None:
    base = world.system.url
    answer = page.goto(f"{base}/ui/batches/{world.secret}")
    assert answer is not None and answer.status == 404
    expect(page.locator("#error-message")).to_have_text(f"batch {world.secret} not found")
    answer = page.goto(f"{base}/ui/batches/{world.secret}/jobs")
    assert answer is not None and answer.status == 404
    page.goto(f"{base}/ui/batches?q=")
    expect(page.locator(f"#batch-{world.tree}")).to_be_visible()
    expect(page.locator(f"#batch-{world.secret}")).to_have_count(0)
    with pytest.raises(urllib.error.HTTPError) as refused:  # the API agrees
        api(world.system, "GET", f"/batches/{world.secret}")
    refused.value.close()
    assert refused.value.code == 404


def test_ops_dashboard_is_for_developers(page: Page, world: World) -> None:
    answer = page.goto(f"{world.system.url}/ui/ops")
    assert answer is not None and answer.status == 403
    expect(page.locator("nav")).not_to_contain_text("Ops")


# --- pages ---------------------------------------------------------------------------------------
def test_batch_list_screenshot(page: Page, world: World) -> None:
    base = world.system.url
    page.goto(f"{base}/ui/batches")
    expect(page.locator("textarea[name=q]")).to_have_value("user = tester")
    page.fill("textarea[name=q]", "name = ui-tree")
    page.click("form.query button[type=submit]")
    page.wait_for_url(re.compile(r".*q=name\+%3D\+ui-tree.*"))
    rows = page.locator("#batches tbody tr")
    expect(rows).to_have_count(1)
    row = page.locator(f"#batch-{world.tree}")
    expect(row.locator("td.name")).to_have_text("ui-tree")
    expect(row.locator(".state")).to_have_text("failure")
    expect(row.locator("td.n-jobs")).to_have_text("3")
    cost = api(world.system, "GET", f"/batches/{world.tree}")["cost"]
    assert cost > 0
    expect(row.locator("td.cost")).to_have_text(usd(cost))
    expect(page.locator(f"#batch-{world.sleeper}")).to_have_count(0)
    shoot(page, "batch_list")
    page.goto(f"{base}/ui/batches?q=state+%3D%3D&v=2")
    expect(page.locator("#query-error")).to_be_visible()


def test_batch_list_pages_with_a_next_link(page: Page, world: World) -> None:
    s = world.system
    ids = [create_fast(s, f"ui-page-{i}", [], attributes={"ui-page": "yes"})
           for i in range(51)]
    page.goto(f"{s.url}/ui/batches?" + "q=ui-page+%3D+yes&v=2")
    expect(page.locator("#batches tbody tr")).to_have_count(50)
    expect(page.locator(f"#batch-{ids[-1]}")).to_be_visible()  # newest first
    page.click("#next-page")
    expect(page.locator("#batches tbody tr")).to_have_count(1)
    expect(page.locator(f"#batch-{ids[0]}")).to_be_visible()
    expect(page.locator("#next-page")).to_have_count(0)


def test_batch_page_screenshot(page: Page, world: World) -> None:
    page.goto(f"{world.system.url}/ui/batches/{world.tree}")
    expect(page.locator("#batch-name")).to_have_text("ui-tree")
    expect(page.locator("#batch-state")).to_have_text("failure")
    expect(page.locator("#batch-counts")).to_contain_text("3 / 3")
    cost = api(world.system, "GET", f"/batches/{world.tree}")["cost"]
    expect(page.locator("#batch-cost")).to_have_text(usd(cost))
    tree = page.locator("#group-tree")
    expect(tree.locator("#group-0 > .group-line .group-name")).to_have_text("ui-tree")
    alpha = tree.locator("#group-0 > ul > #group-1")
    expect(alpha.locator("> .group-line .group-name")).to_have_text("alpha")
    beta = alpha.locator("> ul > #group-2")  # nested under alpha, not the root
    expect(beta.locator("> .group-line .group-name")).to_have_text("beta")
    expect(beta.locator("> .group-line .state")).to_have_text("failure")
    expect(alpha.locator("> .group-line .counts")).to_have_text("2 / 2")
    expect(page.locator("#cancel-batch")).to_have_count(0)  # complete: nothing to cancel
    shoot(page, "batch_page")


def test_cancel_button_cancels_a_running_batch(page: Page, world: World) -> None:
    base = world.system.url
    page.goto(f"{base}/ui/batches/{world.sleeper}")
    expect(page.locator("#batch-state")).to_have_text("running")
    shoot(page, "batch_page_running")
    page.click("#cancel-batch")
    page.wait_for_url(f"{base}/ui/batches/{world.sleeper}")
    expect(page.locator("#batch-state")).to_have_text("cancelled")
    expect(page.locator("#cancel-batch")).to_have_count(0)
    wait_for("the sleeper to be cancelled", lambda: api(
        world.system, "GET", f"/batches/{world.sleeper}/jobs/1")["state"] == "Cancelled")


def test_job_list_screenshot(page: Page, world: World) -> None:
    base = world.system.url
    page.goto(f"{base}/ui/batches/{world.tree}/jobs")
    expect(page.locator("#jobs tbody tr")).to_have_count(3)
    expect(page.locator("#job-1 td.name")).to_have_text("greeter")
    expect(page.locator("#job-3 .state")).to_have_text("Failed")
    page.fill("textarea[name=q]", "state = failed")
    page.click("form.query button[type=submit]")
    expect(page.locator("#jobs tbody tr")).to_have_count(1)
    expect(page.locator("#job-3 td.name")).to_have_text("beta-job")
    shoot(page, "job_list")
    # a group's jobs: alpha holds job 2 and, through beta, job 3
    page.goto(f"{base}/ui/batches/{world.tree}/job-groups/1/jobs")
    expect(page.locator("#jobs tbody tr")).to_have_count(2)
    expect(page.locator("#job-1")).to_have_count(0)
    page.goto(f"{base}/ui/batches/{world.tree}/job-groups/1/jobs?recursive=0")
    expect(page.locator("#jobs tbody tr")).to_have_count(1)
    expect(page.locator("#job-2 td.name")).to_have_text("alpha-job")
    shoot(page, "job_group_job_list")


def test_job_page_screenshot(page: Page, world: World) -> None:
    page.goto(f"{world.system.url}/ui/batches/{world.tree}/jobs/1")
    expect(page.locator("#job-state")).to_have_text("Success")
    expect(page.locator("#job-exit-code")).to_have_text("0")
    expect(page.locator("#job-name")).to_have_text("greeter")
    expect(page.locator("#spec-image")).to_have_text("ubuntu:24.04")
    expect(page.locator("#spec-command")).to_have_text(f"echo {LOG_LINE}")
    expect(page.locator("#log-main")).to_have_text(LOG_LINE + "\n")
    attempts = page.locator("#attempts tbody tr")
    expect(attempts).to_have_count(1)
    expect(attempts.locator("td").nth(2)).to_have_text(re.compile(r"^\d{4}-\d\d-\d\dT"))
    expect(attempts.locator("td").nth(3)).to_have_text(re.compile(r"^\d{4}-\d\d-\d\dT"))
    status = api(world.system, "GET", f"/batches/{world.tree}/jobs/1")
    assert status["cost"] > 0
    expect(page.locator("#job-cost")).to_have_text(usd(status["cost"]))
    compute = next(r for r in status["cost_breakdown"] if r["resource"].startswith("compute/"))
    expect(page.locator("table.breakdown tr", has_text=compute["resource"]).locator(
        "td").nth(1)).to_have_text(usd(compute["cost"]))
    if status.get("waiting_reason"):  # the scheduler's note, where the API has one
        expect(page.locator("#waiting-reason")).to_be_visible()
    shoot(page, "job_page")
    page.goto(f"{world.system.url}/ui/batches/{world.tree}/jobs/3")
    expect(page.locator("#job-state")).to_have_text("Failed")
    expect(page.locator("#job-exit-code")).to_have_text("1")


def test_billing_page_screenshot(page: Page, world: World) -> None:
    page.goto(f"{world.system.url}/ui/billing")
    project = page.locator("#project-e2e")
    expect(project.locator("td").nth(1)).to_have_text("open")
    expect(project.locator("td").nth(2)).to_have_text("none")
    assert float(project.locator("td.cost").inner_text().lstrip("$")) > 0
    expect(project.locator("td").nth(4)).to_have_text("tester")
    expect(page.locator("#project-hidden")).to_have_count(0)
    expect(page.locator("#by-project-user tbody tr")).to_have_count(1)
    expect(page.locator("#by-project-user tbody tr td").nth(1)).to_have_text("tester")
    today = time.strftime("%Y-%m-%d", time.gmtime())
    expect(page.locator("#by-day tbody tr").first.locator("td").first).to_have_text(today)
    expect(page.locator("#by-day-detail")).not_to_contain_text("outsider")
    shoot(page, "billing_page")


def test_ops_dashboard_screenshot(browser: Browser, world: World) -> None:
    s = world.system
    busy = create_fast(s, "ui-ops-sleeper", [job_spec(1, ["sleep", "600"], "busy")])
    # Running from the SJ; the attempt's start (the busy table's) from the MJS, a second later.
    wait_for("the ops sleeper's start",
             lambda: [a["start_time"] is not None  # null before the first attempt
                      for a in api(s, "GET", f"/batches/{busy}/jobs/1/attempts") or []]
             == [True],
             timeout=180)
    (attempt,) = api(s, "GET", f"/batches/{busy}/jobs/1/attempts")
    context = login(browser, world.system, world.system.dev_token)
    try:
        page = context.new_page()
        page.goto(f"{world.system.url}/ui/ops")
        expect(page.locator("#who")).to_have_text("boss (developer)")
        expect(page.locator('meta[http-equiv="refresh"]')).to_have_count(1)
        rates = page.locator("#rates tbody tr")
        expect(rates).to_have_count(2)
        mjs_15 = int(page.locator("#rates-15 td.count.mjs").inner_text())
        assert mjs_15 >= 4  # the tree's three jobs and the sleeper started minutes ago
        assert int(page.locator("#rates-15 td.count.sj").inner_text()) >= 4
        assert int(page.locator("#rates-15 td.count.mjc").inner_text()) >= 3  # the tree's
        lag = page.locator("#lag tbody tr", has_text="batch-events")
        assert lag.count() == 4  # one row per partition
        expect(page.locator("#lag tbody")).to_contain_text("projector")
        pool = page.locator("#cores-pool tbody tr", has_text="standard")
        # running jobs and cores: the sleeper (and the world's, unless the cancel test ran)
        assert int(pool.locator("td").nth(3).inner_text()) >= 1
        assert float(pool.locator("td").nth(4).inner_text()) >= 1.0
        user = page.locator("#cores-user tbody tr", has_text="tester")
        assert int(user.locator("td").nth(3).inner_text()) >= 1
        active = page.locator("#instances tr.instance-row", has_text="active")
        expect(active.first).to_contain_text("standard")  # from the workers' instance events
        instance = page.locator(f'[id="busy-{attempt["instance_name"]}"]')
        expect(instance.locator("td").nth(0)).to_have_text("standard")
        assert int(instance.locator("td").nth(2).inner_text()) >= 1  # running attempts
        cancelled = page.locator(f"#cancel-{world.cancelled}-0")
        expect(cancelled.locator("td").nth(4)).to_have_text("user")
        expect(cancelled.locator("td").nth(2)).to_have_text("tester")
        expect(page.locator("#unpublished")).to_have_text(re.compile(r"^\d+$"))
        shoot(page, "ops_dashboard")
    finally:
        context.close()
        api(s, "PATCH", f"/batches/{busy}/cancel")


def test_logout_ends_the_session(browser: Browser, world: World) -> None:
    context = login(browser, world.system, world.system.token)
    try:
        page = context.new_page()
        page.goto(f"{world.system.url}/ui/batches")
        page.click("header form.logout button")
        page.wait_for_url(re.compile(r".*/ui/login$"))
        page.goto(f"{world.system.url}/ui/billing")
        assert "/ui/login?next=%2Fui%2Fbilling" in page.url
    finally:
        context.close()


def test_job_template_shows_the_waiting_reason_and_escapes_logs() -> None:
    job: dict[str, Any] = {
           "batch_id": 7, "job_id": 2, "name": "<b>n</b>", "state": "Ready", "exit_code": None,
           "cost": 0.0, "duration": None, "inst_coll": "standard", "user": "ann",
           "billing_project": "p", "always_run": False, "cost_breakdown": [],
           "spec": {"process": {"image": "img", "command": ["echo", "<script>x</script>"]}},
           "waiting_reason": {"reason": "no_capacity", "message": "all 2 instances are busy",
                              "since": "2026-01-01T00:00:00.000Z", "since_ms": 0}}
    html = routes.templates().get_template("job.html").render(
        user=User("ann", False), csrf="c", prefix="/ui", job=job,
        spec=views.spec_summary(job["spec"]), attempts=[], error=None,
        logs={"main": "<img src=x onerror=alert(1)>"}, waiting=views.waiting_reason(job))
    assert 'id="waiting-reason"' in html and "no_capacity" in html
    assert "all 2 instances are busy" in html and "since 2026-01-01T00:00:00.000Z" in html
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "<script>" not in html and "<b>n</b>" not in html
    job["waiting_reason"] = None
    assert views.waiting_reason(job) is None
