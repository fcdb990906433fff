"""The API server's door, attacked (the shared SmolLM2 server: --api-key, bound to
127.0.0.1, max_model_len 2048):

- A web page whose name was re-pointed at 127.0.0.1 (DNS rebinding) sends its own Host
  header: 400, whatever the path.
- Huge prompts are refused before any tokenizing, and small requests are served meanwhile
  (four 28 MB prompts used to make every small request 408 for about 70 s).
- A long token-id list is refused on its length, before any per-id work, and /health keeps
  answering (a 33 MB list used to block it for 6 s).
- `priority` is bounded; a chat of more messages than the context holds is refused.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import threading

import httpx
from server_helper import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def test_a_rebound_host_name_is_refused(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        for host in ("attacker.example", "attacker.example:8000", "127.0.0.1.nip.io"):
            for path in ("/v1/models", "/health", "/"):
                r = c.get(path, headers={"Host": host})
                assert r.status_code == 400 and r.json()["error"]["code"] == "host_not_allowed"
        for host in (
            f"localhost:{server.port}",
            f"127.0.0.1:{server.port}",
            f"[::1]:{server.port}",
        ):
            assert c.get("/v1/models", headers={"Host": host}).status_code == 200


def test_huge_prompts_are_refused_at_once_and_small_requests_go_on(http, model_name):
    huge = "word " * (28 * 2**20 // 5)
    small = {"model": model_name, "prompt": "Hello", "max_tokens": 2}
    with cf.ThreadPoolExecutor(6) as pool:
        bigs = [
            pool.submit(http.post, "/v1/completions", json={"prompt": huge, "max_tokens": 1})
            for _ in range(4)
        ]
        smalls = [http.post("/v1/completions", json=small) for _ in range(6)]
        for r in bigs:
            r = r.result()
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert [r.status_code for r in smalls] == [200] * 6


def test_a_long_id_list_is_refused_on_its_length_and_health_answers(server, http):
    body = json.dumps({"prompt": [1] * 5_000_000, "max_tokens": 1})
    health: list[int] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            health.append(httpx.get(server.url + "/health", timeout=30).status_code)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        r = http.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    finally:
        done.set()
        prober.join()
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and "5000000 tokens" in err["message"]
    assert health and set(health) == {200}
    r = http.post("/detokenize", json={"tokens": [1] * 100_000})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_priority_is_bounded(http, model_name):
    for priority in (2**31, -(2**31) - 1, 2**70):
        r = http.post(
            "/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "priority": priority}
        )
        assert r.status_code == 400 and "priority" in r.text
    r = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "priority": -5})
    assert r.status_code == 200


def test_a_chat_longer_than_the_context_is_refused_before_rendering(http):
    messages = [{"role": "user", "content": "x"}] * 3000  # more messages than 2,048 tokens
    r = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = http.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "y" * 4_000_000}]}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
