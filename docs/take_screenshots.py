"""The README's two screenshots of the web app (docs/chat.png, docs/engine.png), taken from
a real server on this machine in headless Chromium:

    .venv/bin/python docs/take_screenshots.py [--port 8321] [extra `cadence serve` flags]

Starts `cadence serve` (the default model), chats once, then opens the engine view while
`cadence bench serve` runs a shared-prefix load, and shoots it mid-load.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

DOCS = Path(__file__).parent
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ARGS += ["--disable-component-update", "--disable-sync", "--no-first-run"]


def main() -> None:
    port = "8321"
    extra = sys.argv[1:]
    if extra[:1] == ["--port"]:
        port, extra = extra[1], extra[2:]
    url = f"http://127.0.0.1:{port}"
    cli = [sys.executable, "-m", "cadence.cli.main"]
    server = subprocess.Popen([*cli, "serve", "--port", port, *extra])
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.goto(url + "/")
            page.fill("#system-prompt", "You are a concise assistant.")
            page.fill("#max-tokens", "200")
            page.fill("#chat-input", "Give me three tips for writing clear code.")
            page.press("#chat-input", "Enter")
            page.wait_for_selector(".msg.assistant .meta", timeout=300_000)
            page.screenshot(path=str(DOCS / "chat.png"))

            page.set_viewport_size({"width": 1440, "height": 1500})
            page.click("#tab-engine")
            load = subprocess.Popen(
                [*cli, "bench", "serve", "--base-url", url, "--dataset-name", "shared-prefix"]
                + ["--num-prompts", "128", "--prefix-repetition-num-prefixes", "8"]
                + ["--prefix-repetition-prefix-len", "256", "--prefix-repetition-suffix-len"]
                + ["64", "--prefix-repetition-output-len", "96", "--max-concurrency", "16"],
                stdout=subprocess.DEVNULL,
            )
            page.wait_for_timeout(25_000)
            page.screenshot(path=str(DOCS / "engine.png"))
            load.wait()
            browser.close()
    finally:
        server.terminate()
        server.wait(30)
    print("wrote", DOCS / "chat.png", DOCS / "engine.png")


if __name__ == "__main__":
    main()
