"""Images from URLs, within bounds: data: URLs of the accepted formats decode to RGB;
other schemes, non-images, bad base64, oversized or over-pixelled images are MediaErrors;
http(s) URLs are fetched only from allowed hosts, within the byte bound, no redirects."""

from __future__ import annotations

import http.server
import io
import threading

import pytest
from vision_helpers import data_url, random_image

from cadence.config import ModelConfig
from cadence.multimodal.media import MediaError, MediaPolicy, load_image


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP"])
def test_data_urls_of_each_format_decode_to_rgb(fmt):
    image = load_image(data_url(random_image(21, 13, 0), fmt), MediaPolicy())
    assert image.mode == "RGB" and image.size == (21, 13)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("file:///etc/passwd", "scheme 'file'"),
        ("ftp://example.com/a.png", "scheme 'ftp'"),
        ("/etc/passwd", r"scheme '\(none\)'"),
        ("data:image/png;base64,@@@", "not valid base64"),
        ("data:image/png,rawbytes", "must be base64"),
        ("data:text/plain;base64,aGVsbG8=", "not an image"),
        ("data:image/png;base64,aGVsbG8=", "cannot decode the image"),
        ("http://example.com/a.png", "does not fetch image URLs"),
        ("", "non-empty"),
    ],
)
def test_unusable_urls_are_refused_with_the_reason(url, why):
    with pytest.raises(MediaError, match=why):
        load_image(url, MediaPolicy())


def test_bounds_on_bytes_and_pixels_come_before_decoding():
    url = data_url(random_image(40, 40, 1))
    with pytest.raises(MediaError, match="at most 1000 pixels"):
        load_image(url, MediaPolicy(max_pixels=1000))
    with pytest.raises(MediaError, match="larger than 100 bytes"):
        load_image(url, MediaPolicy(max_bytes=100))


def test_allowed_domains_match_hosts_and_their_subdomains_only():
    policy = MediaPolicy(allowed_domains=("example.com",))
    assert policy.allows_host("example.com") and policy.allows_host("img.Example.com")
    assert not policy.allows_host("example.com.evil.org")
    assert not policy.allows_host("badexample.com")


class _Images(http.server.BaseHTTPRequestHandler):
    png = b""

    def do_GET(self):  # noqa: N802
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/a.png")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()
        self.wfile.write(self.png)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def image_host():
    buf = io.BytesIO()
    random_image(30, 20, 2).save(buf, format="PNG")
    _Images.png = buf.getvalue()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_allowed_hosts_are_fetched_within_bounds_without_redirects(image_host):
    allowed = MediaPolicy(allowed_domains=("127.0.0.1",))
    assert load_image(image_host + "/a.png", allowed).size == (30, 20)
    with pytest.raises(MediaError, match="not in the server's allowed"):
        load_image(image_host + "/a.png", MediaPolicy(allowed_domains=("example.com",)))
    with pytest.raises(MediaError, match="HTTP 302"):
        load_image(image_host + "/redirect", allowed)
    with pytest.raises(MediaError, match="larger than 64 bytes"):
        load_image(image_host + "/a.png", MediaPolicy(("127.0.0.1",), max_bytes=64))


def test_the_image_limit_reads_vllms_json():
    def limit(value):
        return ModelConfig(limit_mm_per_prompt=value).images_per_prompt()

    assert limit(None) == 16
    assert limit('{"image": 3}') == 3 and limit({"image": 0}) == 0
    for bad in ('{"video": 1}', "[1]", '{"image": -1}', "nope"):
        with pytest.raises(ValueError):
            limit(bad)
