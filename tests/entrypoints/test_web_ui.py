"""The web app at `/`, in a real browser: headless Chromium (Debian's package) driven by
Playwright. It asks for the API key, streams a chat answer (and a structured one), and its
engine view shows the counters move while `cadence bench serve` loads the server. Nothing
the page asks for leaves the machine. Screenshots go to build/screenshots/ (not committed;
CADENCE_SCREENSHOT_DIR moves them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from browser_helper import browser_page, read_int, wait_until
from server_helper import API_KEY

pytestmark = pytest.mark.slow  # starts servers of its own (make test-fast skips it)

SHOTS = Path(
    os.environ.get("CADENCE_SCREENSHOT_DIR", Path(__file__).parents[2] / "build" / "screenshots")
)


@pytest.fixture(scope="module")
def page(server):
    SHOTS.mkdir(parents=True, exist_ok=True)
    with browser_page(server.url + "/") as pg:
        yield pg


def test_the_page_asks_for_the_key_then_chats_with_streaming(page, server):
    page.wait_for_selector("#api-key-dialog[open]", timeout=10_000)
    page.fill("#api-key-input", API_KEY)
    page.click("#api-key-save")
    wait_until(page, lambda: "Smol" in page.inner_text("#model-name"), what="the model name")
    assert page.is_hidden("#attach")  # a text model: no image picker
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "48")
    page.fill("#chat-input", "Name three primary colors.")
    page.press("#chat-input", "Enter")
    # Streaming: text is on the page while the answer is still coming (Stop is shown).
    wait_until(
        page,
        lambda: page.is_visible("#stop") and page.inner_text(".msg.assistant .content").strip(),
        what="text streaming in while Stop is shown",
    )
    meta = page.wait_for_selector(".msg.assistant .meta", timeout=120_000).inner_text()
    assert "TTFT" in meta and "tok/s" in meta, meta
    first = page.inner_text(".msg.assistant .content")
    assert first.strip()
    page.screenshot(path=str(SHOTS / "chat.png"))
    # Regenerate (greedy): the same answer again, in place of the first.
    old_meta = page.query_selector(".msg.assistant .meta")
    page.click("#regenerate")
    wait_until(page, lambda: not old_meta.is_visible(), what="the old answer taken away")
    page.wait_for_selector(".msg.assistant .meta", timeout=120_000)
    assert page.inner_text(".msg.assistant .content") == first
    assert len(page.query_selector_all(".msg.assistant")) == 1


def test_a_json_schema_constrains_the_answer(page):
    schema = {
        "type": "object",
        "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]}},
        "required": ["color"],
    }
    page.click("#new-chat")
    page.fill("#json-schema", json.dumps(schema))
    page.fill("#chat-input", "Which color is the sky? Answer in JSON.")
    page.press("#chat-input", "Enter")
    page.wait_for_selector(".msg.assistant .meta", timeout=120_000)
    answer = json.loads(page.inner_text(".msg.assistant .content"))
    assert answer["color"] in ("red", "green", "blue")
    page.fill("#json-schema", "")
    page.locator("#json-schema").dispatch_event("change")
    # Conversations are kept in the browser: both are listed, and survive a reload.
    page.reload()
    page.wait_for_selector("#conversations li")
    assert len(page.query_selector_all("#conversations li")) == 2


def test_the_engine_view_moves_under_load(page, server):
    page.click("#tab-engine")
    wait_until(page, lambda: read_int(page, "#stat-steps") >= 0, what="the first stats")
    steps0 = read_int(page, "#stat-steps")
    load = subprocess.Popen(
        [sys.executable, "-m", "cadence.cli.main", "bench", "serve"]
        + ["--base-url", server.url, "--api-key", API_KEY, "--num-prompts", "24"]
        + ["--max-concurrency", "6", "--random-input-len", "48", "--random-output-len", "48"]
        + ["--ignore-eos"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    saw = {"rows": 0, "running": 0, "gen_tps": 0.0}
    try:
        deadline = time.monotonic() + 180
        while load.poll() is None and time.monotonic() < deadline:
            saw["rows"] = max(saw["rows"], len(page.query_selector_all("#requests-table tbody tr")))
            saw["running"] = max(saw["running"], read_int(page, "#stat-running"))
            tps = page.inner_text("#stat-gen-tps").replace(",", "")
            saw["gen_tps"] = max(saw["gen_tps"], float(tps) if tps[:1].isdigit() else 0.0)
            if saw["rows"] >= 2 and saw["gen_tps"] > 0 and saw["running"] >= 2:
                page.wait_for_timeout(2500)  # a little more history in the charts
                page.screenshot(path=str(SHOTS / "engine.png"), full_page=True)
                break
            page.wait_for_timeout(250)
    finally:
        stopped = load.poll() is None
        if stopped:  # seen what the view must show: the rest of the load adds nothing
            load.terminate()
        _, err = load.communicate(timeout=60)
    assert saw["rows"] >= 2 and saw["running"] >= 2 and saw["gen_tps"] > 0, (
        saw,
        err.decode()[-2000:],
    )
    if not stopped:
        assert load.returncode == 0, err.decode()[-2000:]
    # The client's hang-ups end its requests: the view drains to 0 running.
    wait_until(page, lambda: read_int(page, "#stat-running") == 0, what="the load to drain")
    assert read_int(page, "#stat-steps") > steps0


def test_nothing_left_the_machine_and_no_script_failed(page, server):
    assert page.urls and all(u.startswith(server.url + "/") for u in page.urls), [
        u for u in page.urls if not u.startswith(server.url)
    ]
    # (The page's first call, before it has the key, is a 401: that one is expected.)
    assert [e for e in page.errors if "status of 401" not in e] == []
