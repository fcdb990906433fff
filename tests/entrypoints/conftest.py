"""A real `cadence serve` on 127.0.0.1 (a free port), started once per test session."""

from __future__ import annotations

import httpx
import pytest
from server_helper import API_KEY, Server


@pytest.fixture(scope="session")
def server():
    """SmolLM2 in float32, with an API key, 8 sequences at once and 8 more queued."""
    srv = Server(
        [
            "--dtype",
            "float32",
            "--api-key",
            API_KEY,
            "--max-num-seqs",
            "8",
            "--max-num-waiting",
            "8",
            "--kv-cache-memory",
            str(512 * 2**20),
            "--max-model-len",
            "2048",
        ]
    )
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def http(server):
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120
    ) as c:
        yield c


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def model_name(http):
    return http.get("/v1/models").json()["data"][0]["id"]
