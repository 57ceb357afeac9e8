"""The dashboard in a real browser: Debian's Chromium, headless, driven by Playwright.

A run is written (EnvSched on a real SQLite store, with its explanation file) while the page is open; the test
checks that the coverage view gains the new step by itself, that a task whose instruction holds ``<script>``
renders as text, and takes the screenshot docs/dashboard.md shows (written to ``$ENVSCHED_DASHBOARD_SCREENSHOT``
when set, e.g. ``docs/images/dashboard.png``; to the test's temporary folder otherwise).

Chromium is the system one (``apt-get install chromium``; .ci/run installs it): Playwright's own browser
download is never used. The test skips, saying why, only when that executable is missing.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from .conftest import HOSTILE_ENV, HOSTILE_ID, HOSTILE_INSTRUCTION, make_pool

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = [pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                 reason=f"{CHROMIUM} not found: install Debian's chromium (apt-get install chromium; "
                                        ".ci/run does it)"),
              pytest.mark.slow]  # a browser: outside the fast lane


@pytest.fixture
def served(tmp_path, run_writer):
    """A run of 30 steps and the dashboard over it, on 127.0.0.1 (any free port)."""
    uvicorn = pytest.importorskip("uvicorn")
    from envsched.dashboard.app import create_app

    store, run_file = tmp_path / "run.sqlite", tmp_path / "run.jsonl"
    w = run_writer(store, run_file, batch_size=16, pool=make_pool(10, 10, hostile_env=False)).run(30)
    app = create_app(str(store), run_file=str(run_file), poll_s=1.0)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline, "the dashboard did not start"
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", w
    server.should_exit = True
    thread.join(timeout=30)


def test_live_page_in_chromium(served, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    url, writer = served
    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM, args=ARGS,
                                                   headless=True, viewport={"width": 1400, "height": 1000})
        try:
            page = ctx.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(url + "/")
            page.wait_for_selector("#fig-coverage[data-steps='30']", state="attached", timeout=60_000)
            x = page.evaluate("document.getElementById('fig-coverage').data[0].x")
            assert x == list(range(1, 31))

            # a new step committed while the page is open appears without a reload
            writer.step()
            page.wait_for_selector("#fig-coverage[data-steps='31']", state="attached", timeout=30_000)
            assert page.evaluate("document.getElementById('fig-coverage').data[0].x") == list(range(1, 32))
            assert page.locator("#picks tbody tr").first.locator("td").first.inner_text() == "31"

            # the hostile instruction is shown as text: no script ran, no element was made from it
            page.fill("#search-task", HOSTILE_ID)
            page.click("#search button[type=submit]")
            cell = page.locator("#picks td.task").filter(has_text=HOSTILE_ID).first
            cell.wait_for(timeout=30_000)
            assert cell.locator(".instruction").inner_text() == HOSTILE_INSTRUCTION
            assert page.locator("#picks img, #picks script").count() == 0
            assert page.evaluate("window.__pwned === undefined")

            page.click("#search-clear")
            page.locator("#picks td.task").first.wait_for(timeout=30_000)
            page.evaluate("window.scrollTo(0, 0)")
            page.mouse.move(5, 5)  # no hover labels or mode bar in the picture
            page.wait_for_timeout(500)
            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True, clip={"x": 0, "y": 0, "width": 1400, "height": 1640})
            assert shot.stat().st_size > 20_000
            target = os.environ.get("ENVSCHED_DASHBOARD_SCREENSHOT")
            if target:
                Path(target).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(shot, target)
        finally:
            ctx.close()
    assert errors == []


def test_report_opens_offline_in_chromium(tmp_path, run_writer):
    sync_api = pytest.importorskip("playwright.sync_api")
    from envsched.dashboard.report import write_report

    store, run_file = tmp_path / "run.sqlite", tmp_path / "run.jsonl"
    w = run_writer(store, run_file, batch_size=49).run(3)
    out = write_report(store, tmp_path / "report.html", run_file=run_file)
    w.close()
    requests: list[str] = []
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM, args=ARGS,
                                                   headless=True, viewport={"width": 1400, "height": 1000})
        try:
            page = ctx.new_page()
            page.on("request", lambda r: requests.append(r.url))
            page.goto(out.as_uri())
            page.locator("#fig-coverage .main-svg").first.wait_for(timeout=60_000)
            assert page.evaluate("document.getElementById('fig-coverage').data[0].x") == [1, 2, 3]
            cell = page.locator("#picks td.task").filter(has_text=HOSTILE_ID).first
            assert cell.locator(".instruction").inner_text() == HOSTILE_INSTRUCTION
            # an environment name with markup is a plain label in the plots (plotly reads a few tags in labels)
            ticks = page.locator("#fig-coverage .ytick text").all_text_contents()
            assert HOSTILE_ENV in ticks, repr(ticks[-3:])
            assert page.locator("#fig-coverage a, #fig-coverage i, #fig-signal_env a, #fig-signal_env i").count() == 0
            assert page.evaluate("window.__pwned === undefined")
        finally:
            ctx.close()
    assert [u for u in requests if not u.startswith(("file:", "data:", "blob:"))] == []
