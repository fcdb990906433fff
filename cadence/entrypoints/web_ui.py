"""The built-in web app at `/`: chat, and a live view of the engine.

Plain HTML, CSS and JavaScript shipped in the package (cadence/entrypoints/web/), no build
step, no CDN: the page and everything it loads come from this server, and its Content
Security Policy forbids anything else. The page itself is public (it asks for the API key
when the server has one); the data it reads (/v1/...) is protected as usual.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, Response

WEB_DIR = Path(__file__).parent / "web"
ASSETS = {  # file -> media type; nothing else under /ui/ is served
    "app.css": "text/css; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "chat.js": "text/javascript; charset=utf-8",
    "engine.js": "text/javascript; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
# Only this origin: no request can leave the machine from the page.
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def is_public(path: str) -> bool:
    """The page and its assets need no API key."""
    return path == "/" or path.startswith("/ui/")


def install_web_ui(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    async def index():
        return FileResponse(WEB_DIR / "index.html", media_type="text/html", headers=HEADERS)

    @app.get("/ui/{name}", include_in_schema=False)
    async def asset(name: str):
        media = ASSETS.get(name)
        if media is None:
            return Response(status_code=404)
        return FileResponse(WEB_DIR / name, media_type=media, headers=HEADERS)
