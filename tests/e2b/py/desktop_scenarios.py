"""Computer use with the unmodified `e2b_desktop` 2.7.2 (PyPI) against the gateway in the
domain mode (HTTPS on 443, sandboxes at `<port>-<id>.<domain>`), on the `desktop` template.

`Sandbox.create()` (Xvfb, then Xfce, as the SDK starts them), screenshots that are real PNGs of
the screen's size, the mouse (move, clicks, drag, scroll) and the keyboard (typing, keys,
combinations) acting on real windows, `launch`, `open`, `wait`, window queries, and
`stream.start()`: its URL opened in a real browser (Debian's chromium), where noVNC connects
through the gateway's data plane and draws the desktop; with `require_auth`, a URL without the
key does not connect.
"""

import io
import os
import time

import pytest
from e2b_desktop import Sandbox
from PIL import Image, ImageChops
from playwright.sync_api import sync_playwright

DOMAIN = os.environ["E2B_DOMAIN"]
ADDRESS = os.environ["E2B_TEST_RESOLVE"].partition("=")[2]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium-headless-shell")


def image(data) -> Image.Image:
    assert bytes(data[:8]) == b"\x89PNG\r\n\x1a\n", "a PNG"
    return Image.open(io.BytesIO(bytes(data))).convert("RGB")


def changed_share(a: Image.Image, b: Image.Image) -> float:
    diff = ImageChops.difference(a, b).convert("L").point(lambda v: 255 if v > 16 else 0)
    return diff.histogram()[255] / (a.width * a.height)


def eventually(what, check, timeout=20.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - the last error is reported
            last = e
        time.sleep(0.3)
    pytest.fail(f"{what}: {last!r}")


def windows(d: Sandbox, cls: str) -> list[str]:
    out = d.commands.run(f"xdotool search --onlyvisible --class {cls} || true").stdout
    return [w for w in out.split() if w]


@pytest.fixture(scope="module")
def desktop():
    d = Sandbox.create(timeout=600)
    yield d
    d.kill()


def test_screenshots_are_pngs_of_the_screen(desktop):
    shot = image(desktop.screenshot())
    assert shot.size == (1024, 768)
    assert desktop.get_screen_size() == (1024, 768)
    # The desktop is drawn: a panel, icons, a background, not one flat colour.
    assert len(shot.getcolors(maxcolors=1 << 20) or []) > 20
    streamed = b"".join(desktop.screenshot(format="stream"))
    assert image(streamed).size == (1024, 768)
    # The SDK removes its files: nothing left in /tmp.
    assert "screenshot-" not in desktop.commands.run("ls /tmp").stdout


def test_the_mouse_acts_on_the_desktop(desktop):
    desktop.move_mouse(100, 200)
    assert desktop.get_cursor_position() == (100, 200)
    desktop.drag((300, 300), (400, 350))
    assert desktop.get_cursor_position() == (400, 350)
    # Scrolling on the desktop moves between workspaces: down two and back up two.
    desktop.scroll("down", 2)
    desktop.scroll("up", 2)
    desktop.left_click(700, 500)

    # A double click on the desktop's Home icon opens the file manager: the next screenshot
    # shows its window.
    before = image(desktop.screenshot())
    desktop.double_click(68, 195)
    eventually("the file manager opens", lambda: windows(desktop, "Thunar"))
    desktop.wait(500)
    after = image(desktop.screenshot())
    assert changed_share(before, after) > 0.05
    # Alt+F4 closes it (the window manager's binding).
    desktop.press(["alt", "f4"])
    eventually("the file manager closes", lambda: not windows(desktop, "Thunar"))
    # A middle click on the desktop opens the window manager's workspace menu, and Escape
    # closes it (the menu holds the keyboard while it is open).
    desktop.move_mouse(900, 600)
    desktop.wait(300)
    plain = image(desktop.screenshot())
    desktop.middle_click()
    desktop.wait(500)
    assert changed_share(plain, image(desktop.screenshot())) > 0.01
    desktop.press("escape")
    desktop.wait(300)
    assert changed_share(plain, image(desktop.screenshot())) < 0.01


def test_the_keyboard_types_into_a_launched_application(desktop):
    desktop.launch("xfce4-terminal")
    window = eventually("the terminal opens", lambda: windows(desktop, "xfce4-terminal"))
    assert "Terminal" in desktop.get_window_title(window[0])
    # Typing goes to the focused window: wait until the new terminal has the focus.
    eventually(
        "the terminal has the focus",
        lambda: "Terminal" in desktop.get_window_title(desktop.get_current_window_id()),
    )
    assert desktop.get_application_windows("xfce4-terminal")
    desktop.write("echo typed-by-xdotool $((6*7)) > /tmp/typed.txt", chunk_size=10, delay_in_ms=5)
    desktop.press("enter")
    eventually(
        "the typed command ran",
        lambda: desktop.commands.run("cat /tmp/typed.txt 2>/dev/null || true").stdout.strip()
        == "typed-by-xdotool 42",
    )
    # Keys by name and combinations: ctrl+u clears the line, so only the second word runs.
    desktop.write("echo never")
    desktop.press(["ctrl", "u"])
    desktop.write("echo second > /tmp/keys.txt", delay_in_ms=5)
    desktop.press("enter")
    eventually(
        "ctrl+u took the first line away",
        lambda: desktop.commands.run("cat /tmp/keys.txt 2>/dev/null || true").stdout.strip()
        == "second",
    )
    desktop.commands.run("pkill -x xfce4-terminal || true")


def test_open_and_wait(desktop):
    started = time.monotonic()
    desktop.wait(700)
    assert time.monotonic() - started >= 0.7
    # `open` hands a file to its default application: a page goes to Firefox.
    desktop.files.write(
        "/home/user/page.html",
        "<html><head><title>marker-page-42</title></head><body><h1>hello</h1></body></html>",
    )
    desktop.open("/home/user/page.html")
    eventually(
        "Firefox shows the page",
        lambda: "marker-page-42" in desktop.get_window_title(desktop.get_current_window_id()),
        timeout=60,
    )
    desktop.commands.run("pkill -f 'firefox-es[r]' || true")


def test_a_custom_resolution():
    d = Sandbox.create(resolution=(1280, 800), dpi=120)
    try:
        assert image(d.screenshot()).size == (1280, 800)
        assert d.get_screen_size() == (1280, 800)
    finally:
        d.kill()


def test_the_stream_opens_in_a_browser(desktop):
    desktop.stream.start(require_auth=True)
    key = desktop.stream.get_auth_key()
    url = desktop.stream.get_url(auth_key=key)
    assert url.startswith(f"https://6080-{desktop.sandbox_id}.{DOMAIN}/vnc.html?"), url
    with pytest.raises(RuntimeError):
        desktop.stream.start()  # already running

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            # The sandbox host names resolve to the gateway, as DNS would point them; the
            # gateway's certificate is from its own CA, which this browser does not know.
            args=["--no-sandbox", f"--host-resolver-rules=MAP *.{DOMAIN} {ADDRESS}"],
        )
        context = browser.new_context(ignore_https_errors=True, viewport={"width": 1100, "height": 850})
        page = context.new_page()
        page.goto(url)
        page.wait_for_selector("html.noVNC_connected", timeout=20000)
        canvas = page.locator("#noVNC_container canvas")
        size = canvas.evaluate("(c) => [c.width, c.height]")
        assert size == [1024, 768], size

        # The browser draws what the desktop shows: a marker window appears in it.
        def distinct_colours():
            return page.evaluate(
                """() => {
                    const c = document.querySelector("#noVNC_container canvas");
                    const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
                    const seen = new Set();
                    for (let i = 0; i < d.length; i += 4 * 97) seen.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
                    return seen.size;
                }"""
            )

        eventually("the canvas shows the desktop", lambda: distinct_colours() > 20)
        shots = os.environ.get("DESKTOP_SCREENSHOTS")
        if shots:
            os.makedirs(shots, exist_ok=True)
            page.screenshot(path=os.path.join(shots, "desktop-stream.png"))

        # Without the key the viewer asks for it and does not connect.
        bare = context.new_page()
        bare.goto(desktop.stream.get_url())
        bare.wait_for_selector("#noVNC_credentials_dlg.noVNC_open", timeout=20000)
        assert bare.evaluate("document.documentElement.classList.contains('noVNC_connected')") is False
        browser.close()

    desktop.stream.stop()
    eventually(
        "x11vnc stopped",
        lambda: desktop.commands.run("pgrep -x x11vnc || echo gone").stdout.strip() == "gone",
    )
