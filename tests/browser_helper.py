"""Headless Chromium (Debian's package) driven by Playwright, for the web app's tests."""

from __future__ import annotations

import os
import shutil
import time
from contextlib import contextmanager

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# The flags a locked-down machine needs: no sandbox as root, and no background calls home.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
]


@contextmanager
def browser_page(url: str):
    """A page open at `url`, recording the URLs it asked for (`urls`) and its script
    errors (`errors`). Skips without Chromium, except in CI, which must have it."""
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI needs Debian's chromium for the web UI test (make test installs it)")
        pytest.skip("Debian's chromium is not installed (`make test` installs it)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        # The page runs under its own Content Security Policy (no eval: waits poll from here).
        pg = browser.new_page(viewport={"width": 1440, "height": 900})
        pg.urls, pg.errors = [], []
        pg.on("request", lambda r: pg.urls.append(r.url))
        pg.on("pageerror", lambda e: pg.errors.append(str(e)))
        pg.on("console", lambda m: m.type == "error" and pg.errors.append(m.text))
        pg.goto(url)
        try:
            yield pg
        finally:
            browser.close()


def wait_until(page, condition, timeout_s: float = 60.0, what: str = "") -> None:
    """Poll `condition()` (Python, reading the page) until it holds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        page.wait_for_timeout(50)


def read_int(page, selector: str) -> int:
    text = page.inner_text(selector).replace(",", "").strip()
    return int(text) if text.isdigit() else -1
