"""The web dashboard (`/dashboard`) in a real headless browser: Debian's chromium driven by
Playwright, against the gateway, with sandboxes made by the unmodified e2b Python SDK.

Sign-in (a wrong key refused; the key kept nowhere in the browser; the session cookie HttpOnly
and SameSite=Strict; calls without the page's CSRF token refused), a sandbox appearing within a
second of its creation and not another team's, its CPU/memory chart, pause/resume/extend/kill
from the page, its log followed live, typing in its terminal (a shell on a pty, through the data
plane), the data plane keeping the session cookie from the sandbox, a built template's build
log, a snapshot, and the nodes-and-pools view for the fleet token only; sign-out ending the
session. Screenshots go to $DASHBOARD_SCREENSHOTS.
"""

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest
from e2b import Sandbox, Template
from playwright.sync_api import expect, sync_playwright

API = os.environ["E2B_API_URL"]
KEY = os.environ["E2B_API_KEY"]
OTHER_KEY = os.environ["E2B_OTHER_API_KEY"]
FLEET_TOKEN = os.environ["DASHBOARD_FLEET_TOKEN"]
SHOTS = Path(os.environ.get("DASHBOARD_SCREENSHOTS", "target/dashboard-screenshots"))
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium-headless-shell")


def rest(method, path, key=KEY, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"{API}{path}",
        data=data,
        method=method,
        headers={"X-API-KEY": key, "content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as res:
        text = res.read()
        return json.loads(text) if text else None


def rest_status(method, path, key):
    try:
        rest(method, path, key)
        return 200
    except urllib.error.HTTPError as e:
        return e.code


@pytest.fixture(scope="module")
def browser():
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def signed_in(browser, key=KEY):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.goto(f"{API}/dashboard")
    page.fill("#key", key)
    page.click("button[type=submit]")
    expect(page.locator("#logout")).to_be_visible()
    return context, page


def csrf_fetch(page, path, with_token=True):
    """Status of a GET `path` from the page, with or without the page's CSRF header."""
    return page.evaluate(
        """([path, withToken]) => {
            const csrf = document.querySelector('meta[name="dashboard-csrf"]').content;
            const headers = withToken ? {"x-dashboard-csrf": csrf} : {};
            return fetch(path, {headers}).then((r) => r.status);
        }""",
        [path, with_token],
    )


def test_sign_in_keeps_the_key_out_of_the_browser(browser):
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{API}/dashboard")
    page.fill("#key", "e2b_" + "0" * 40)
    page.click("button[type=submit]")
    expect(page.locator(".error")).to_contain_text("not valid")
    assert not [c for c in context.cookies() if c["name"] == "sgw_session"]

    page.fill("#key", KEY)
    page.click("button[type=submit]")
    expect(page.locator("#namespace")).to_have_text("team-a")
    session = [c for c in context.cookies() if c["name"] == "sgw_session"]
    assert len(session) == 1, context.cookies()
    assert session[0]["httpOnly"] and session[0]["sameSite"] == "Strict", session
    assert KEY not in session[0]["value"]
    assert KEY not in page.url and "key=" not in page.url
    assert "sgw_session" not in page.evaluate("document.cookie")
    stored = page.evaluate(
        "JSON.stringify([Object.entries(localStorage), Object.entries(sessionStorage)])"
    )
    assert KEY not in stored and stored == "[[],[]]", stored
    assert KEY not in page.content()

    # The cookie alone does not make a call: the page's CSRF token must come with it.
    assert csrf_fetch(page, "/v2/sandboxes", with_token=False) == 401
    assert csrf_fetch(page, "/v2/sandboxes") == 200
    # Not an admin: the fleet view is refused, and its tab is not offered.
    assert csrf_fetch(page, "/dashboard/api/fleet") == 403
    assert page.locator("button[data-tab=fleet]").count() == 0
    context.close()


def test_a_sandbox_appears_at_once_and_is_driven_from_the_page(browser):
    context, page = signed_in(browser)
    theirs = Sandbox.create("base", api_key=OTHER_KEY, metadata={"team": "b"})
    mine = None
    try:
        mine = Sandbox.create("base", metadata={"owner": "dashboard-test"})
        created = time.monotonic()
        row = page.locator(f'tr[data-sandbox="{mine.sandbox_id}"]')
        expect(row).to_be_visible(timeout=1000)
        seen_after = time.monotonic() - created
        print(f"the new sandbox showed after {seen_after * 1000:.0f} ms")
        assert seen_after < 1.0
        expect(row.locator("td.metadata")).to_have_text("owner=dashboard-test")
        expect(row.locator("td.state")).to_have_text("running")
        expect(row.locator("td.template")).to_have_text("base")
        # Another team's sandbox never shows.
        page.wait_for_timeout(1200)
        assert page.locator(f'tr[data-sandbox="{theirs.sandbox_id}"]').count() == 0

        # Its CPU/memory chart fills from the metrics the API serves.
        expect(row.locator("td.usage svg.spark polyline.mem")).to_have_count(1, timeout=15000)
        expect(row.locator("td.usage .figures")).to_contain_text("MiB")

        # Its log follows live: a pause made from the page shows up in it.
        row.locator("button", has_text="Open").click()
        logs = page.locator("#logs")
        expect(logs).to_contain_text("claimed as team-a/", timeout=5000)
        row.locator("button", has_text="Pause").click()
        expect(row.locator("td.state")).to_have_text("paused", timeout=10000)
        expect(logs).to_contain_text("paused;", timeout=5000)
        row.locator("button", has_text="Resume").click()
        expect(row.locator("td.state")).to_have_text("running", timeout=10000)
        expect(logs).to_contain_text("resumed", timeout=5000)

        # Extending the timeout moves the end five minutes on.
        before = mine.get_info().end_at
        row.locator("button", has_text="+5 min").click()
        deadline = time.monotonic() + 5
        while mine.get_info().end_at <= before and time.monotonic() < deadline:
            time.sleep(0.1)
        moved = (mine.get_info().end_at - before).total_seconds()
        assert 200 < moved < 400, moved

        # A terminal: a shell on a pty in the sandbox, typed into.
        row.locator("button", has_text="Open").click()
        terminal = page.locator("#terminal")
        expect(page.locator("#terminal-status")).to_contain_text("connected", timeout=10000)
        terminal.click()
        page.keyboard.type("echo dash-$((6*7)) in $(pwd)")
        page.keyboard.press("Enter")
        expect(terminal).to_contain_text("dash-42 in /", timeout=10000)
        page.screenshot(path=str(SHOTS / "dashboard.png"))

        # Kill from the page: the row goes, and so does the sandbox.
        page.once("dialog", lambda d: d.accept())
        row.locator("button", has_text="Kill").click()
        expect(row).to_have_count(0, timeout=5000)
        with pytest.raises(Exception):
            Sandbox.connect(mine.sandbox_id).get_info()
        mine = None
    finally:
        if mine is not None:
            mine.kill()
        theirs.kill()
        context.close()


SERVER = """
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (self.headers.get("cookie") or "").encode()
        self.send_response(200)
        # A hostile sandbox tries to plant a session of its choosing, to fill the browser's
        # cookie jar for the gateway, and to sign the user out.
        self.send_header("set-cookie", "sgw_session=planted; Path=/dashboard")
        self.send_header("set-cookie", "bomb=" + "x" * 3000 + "; Path=/")
        self.send_header("clear-site-data", '"cookies"')
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("0.0.0.0", 8000), H).serve_forever()
"""


def test_the_data_plane_keeps_the_session_from_the_sandbox(browser):
    context, page = signed_in(browser)
    sbx = Sandbox.create("base")
    try:
        sbx.files.write("/tmp/echo_cookie.py", SERVER)
        sbx.commands.run("python3 /tmp/echo_cookie.py", background=True)
        page.evaluate("document.cookie = 'theirs=kept; path=/'")
        seen = None
        for _ in range(50):
            seen = page.evaluate(
                """(id) => fetch("/", {headers: {"e2b-sandbox-id": id, "e2b-sandbox-port": "8000"}})
                    .then((r) => r.ok ? r.text() : null)""",
                sbx.sandbox_id,
            )
            if seen is not None:
                break
            time.sleep(0.2)
        assert seen is not None, "the sandbox's server never answered"
        assert "theirs=kept" in seen, seen
        assert "sgw_session" not in seen, seen
        # What it answered set no cookie on the gateway's origin and cleared nothing.
        names = sorted(c["name"] for c in context.cookies())
        assert names == ["sgw_session", "theirs"], names
        assert csrf_fetch(page, "/v2/sandboxes") == 200
    finally:
        sbx.kill()
        context.close()


def test_templates_builds_and_snapshots(browser):
    name = f"dash-{uuid.uuid4().hex[:8]}"
    built = Template.build(
        Template().from_template("base").run_cmd("echo built-for-the-dashboard"), name
    )
    sbx = Sandbox.create("base")
    try:
        snap = rest("POST", f"/sandboxes/{sbx.sandbox_id}/snapshots", body={})
        context, page = signed_in(browser)
        page.click("button[data-tab=templates]")
        row = page.locator(f'tr[data-template="{built.template_id}"]')
        expect(row).to_contain_text(name, timeout=5000)
        expect(page.locator('tr[data-template="base"]')).to_have_count(1)
        row.locator("button", has_text="Builds").click()
        expect(page.locator("#build-title")).to_contain_text("ready", timeout=5000)
        expect(page.locator("#build-logs")).to_contain_text("built-for-the-dashboard", timeout=5000)

        page.click("button[data-tab=snapshots]")
        expect(page.locator("#snapshots tbody")).to_contain_text(snap["snapshotID"], timeout=5000)
        context.close()
    finally:
        sbx.kill()
        rest("DELETE", f"/templates/{built.template_id}")


def test_the_fleet_view_and_signing_out(browser):
    context, page = signed_in(browser, FLEET_TOKEN)
    expect(page.locator("header .who")).to_contain_text("fleet operator")
    page.click("button[data-tab=fleet]")
    node = page.locator("#fleet tbody tr").first
    expect(node).to_contain_text("up", timeout=5000)
    expect(node).to_contain_text("base/egress")
    page.screenshot(path=str(SHOTS / "dashboard-fleet.png"))

    cookie = [c for c in context.cookies() if c["name"] == "sgw_session"][0]["value"]
    csrf = page.evaluate("document.querySelector('meta[name=\"dashboard-csrf\"]').content")
    page.click("#logout")
    expect(page.locator("#key")).to_be_visible()
    # The ended session is no credential any more, even replayed with its token.
    assert session_status(cookie, csrf) == 401
    context.close()


def test_a_sign_in_from_another_origin_is_refused():
    for headers in (
        {"origin": "http://evil.test"},
        {"origin": API.replace("http://", "https://")},  # another scheme is another origin
        {"sec-fetch-site": "same-site"},  # a sandbox's page on a sibling host
    ):
        req = urllib.request.Request(
            f"{API}/dashboard/login",
            data=urllib.parse.urlencode({"key": KEY}).encode(),
            headers={"content-type": "application/x-www-form-urlencoded", **headers},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=10)
        assert refused.value.code == 403, headers
        assert refused.value.headers.get("set-cookie") is None, headers


def session_status(cookie, csrf):
    """Status of a list call made with a session's cookie and CSRF token, outside the page."""
    req = urllib.request.Request(
        f"{API}/v2/sandboxes", headers={"cookie": f"sgw_session={cookie}", "x-dashboard-csrf": csrf}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as res:
            return res.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_key_taken_out_of_the_key_file_ends_its_sessions(browser):
    keys = Path(os.environ["DASHBOARD_KEYS_FILE"])
    before = keys.read_text()
    temporary = "e2b_" + uuid.uuid4().hex + "00000000"
    keys.write_text(before + f"{temporary} team-c\n")
    try:
        # The gateway re-reads the key file every couple of seconds: wait until it takes the key.
        deadline = time.monotonic() + 10
        while rest_status("GET", "/v2/sandboxes", temporary) != 200:
            assert time.monotonic() < deadline, "the new key was never taken"
            time.sleep(0.3)
        context, page = signed_in(browser, temporary)
        expect(page.locator("#namespace")).to_have_text("team-c")
        cookie = [c for c in context.cookies() if c["name"] == "sgw_session"][0]["value"]
        csrf = page.evaluate("document.querySelector('meta[name=\"dashboard-csrf\"]').content")
        context.close()
        assert session_status(cookie, csrf) == 200
    finally:
        keys.write_text(before)
    # The gateway re-reads the key file every couple of seconds.
    deadline = time.monotonic() + 10
    while session_status(cookie, csrf) != 401:
        assert time.monotonic() < deadline, "the session outlived its key"
        time.sleep(0.5)
