"""Images from URLs, bounded: what a client may make the API process decode or fetch.

    data:image/png;base64,....     always accepted (PNG, JPEG, WebP, GIF, BMP)
    http(s)://host/...             only when the host is in --allowed-media-domains, within
                                   FETCH_TIMEOUT_S and MAX_IMAGE_BYTES, no redirects
    anything else                  refused (file:, ftp:, ...)

Bounds: the encoded bytes (MAX_IMAGE_BYTES), the decoded pixel count (MAX_IMAGE_PIXELS,
checked from the header before any pixel is decoded: a small file that expands to
gigabytes is refused) and each side (MIN_IMAGE_SIDE). Every failure is a MediaError naming
what is wrong: the server answers 400 with it.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_IMAGE_BYTES = 20 * 2**20  # encoded
MAX_IMAGE_PIXELS = 8192 * 8192  # decoded width x height
MIN_IMAGE_SIDE = 1
FETCH_TIMEOUT_S = 10.0
FORMATS = frozenset({"PNG", "JPEG", "WEBP", "GIF", "BMP"})

_DATA_URL = re.compile(
    r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[\w.+-]+)*)"
    r"(?P<b64>;base64)?,",
    re.ASCII,
)


class MediaError(ValueError):
    """An image that cannot be used: the message says why (a 400 over HTTP)."""


@dataclass(frozen=True)
class MediaPolicy:
    """Where images may come from. `allowed_domains`: hosts an http(s) URL may name
    (exactly, or as a parent domain: "example.com" allows "img.example.com"); empty: none."""

    allowed_domains: tuple[str, ...] = ()
    max_bytes: int = MAX_IMAGE_BYTES
    max_pixels: int = MAX_IMAGE_PIXELS
    timeout_s: float = FETCH_TIMEOUT_S

    def allows_host(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        return any(host == d or host.endswith("." + d) for d in self.allowed_domains)


def load_image(url: str, policy: MediaPolicy):
    """The RGB PIL image a data: URL (or an allowed http(s) URL) holds."""
    if not isinstance(url, str) or not url:
        raise MediaError("image_url.url must be a non-empty string")
    if url.startswith("data:"):
        raw = _data_url_bytes(url, policy.max_bytes)
    elif url.startswith(("http://", "https://")):
        raw = _fetch(url, policy)
    else:
        scheme = url.split(":", 1)[0][:20] if ":" in url else "(none)"
        raise MediaError(
            f"image URL scheme {scheme!r} is not accepted: send a data: URL (base64), or an "
            "http(s) URL of a domain the server allows (--allowed-media-domains)"
        )
    return decode_image(raw, policy.max_pixels)


def decode_image(raw: bytes, max_pixels: int = MAX_IMAGE_PIXELS):
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(raw))
    except (UnidentifiedImageError, OSError, ValueError):
        raise MediaError(
            f"cannot decode the image: not a {', '.join(sorted(FORMATS))} file"
        ) from None
    if image.format not in FORMATS:
        raise MediaError(f"image format {image.format} is not one of {sorted(FORMATS)}")
    width, height = image.size
    if min(width, height) < MIN_IMAGE_SIDE or width * height > max_pixels:
        raise MediaError(
            f"image of {width}x{height} pixels: at most {max_pixels} pixels are accepted"
        )
    try:
        image.load()
        return image.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise MediaError(f"cannot decode the image: {e}") from None


def _data_url_bytes(url: str, max_bytes: int) -> bytes:
    head = _DATA_URL.match(url)
    if head is None or not head.group("b64"):
        raise MediaError("an image data: URL must be base64 (data:image/png;base64,...)")
    mime = head.group("mime") or ""
    if mime and not mime.startswith("image/"):
        raise MediaError(f"a data: URL of type {mime!r} is not an image")
    body = url[head.end() :]
    if len(body) > (max_bytes * 4) // 3 + 4:
        raise MediaError(f"the image is larger than {max_bytes} bytes")
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError("the image data: URL is not valid base64") from None


def _fetch(url: str, policy: MediaPolicy) -> bytes:
    host = urlsplit(url).hostname or ""
    if not policy.allowed_domains:
        raise MediaError(
            "this server does not fetch image URLs: send the image as a data: URL, or start "
            "it with --allowed-media-domains"
        )
    if not policy.allows_host(host):
        raise MediaError(f"image host {host!r} is not in the server's allowed media domains")
    import httpx

    chunks, size = [], 0
    deadline = time.monotonic() + policy.timeout_s  # in all: a slow drip is cut off too
    try:
        with httpx.stream("GET", url, timeout=policy.timeout_s, follow_redirects=False) as response:
            if response.status_code != 200:
                raise MediaError(f"fetching the image answered HTTP {response.status_code}")
            for chunk in response.iter_bytes():
                if time.monotonic() > deadline:
                    raise MediaError(f"fetching the image took over {policy.timeout_s:g} s")
                size += len(chunk)
                if size > policy.max_bytes:
                    raise MediaError(f"the image is larger than {policy.max_bytes} bytes")
                chunks.append(chunk)
    except httpx.HTTPError as e:
        raise MediaError(f"cannot fetch the image: {type(e).__name__}") from None
    return b"".join(chunks)
