"""Multi-LoRA over HTTP, as a vLLM user drives it: adapters named in `model` (the OpenAI
client, streamed and not), listed in /v1/models with their parent, loaded and unloaded at
run time behind the admin key, and every bad case an OpenAI-style error naming why."""

from __future__ import annotations

import os
import sys

import httpx
import openai
import pytest
import torch
from lora_helpers import make_adapter, peft_model
from model_helpers import hf_greedy
from server_helper import Server

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "executor"))
from tp_helpers import save_tiny_with_tokenizer  # noqa: E402

pytestmark = pytest.mark.slow  # starts servers of its own (make test-fast skips it)

USER, ADMIN = "user-key-lora", "admin-key-lora"
PROMPT = [1, 504, 6071, 42, 9, 333, 17]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-server")
    base = save_tiny_with_tokenizer(str(root / "tiny"))
    adapters = {n: make_adapter(base, n, str(root)) for n in ("qv8", "all16", "mlp4")}
    srv = Server(
        [
            "--model", base, "--dtype", "float32", "--enable-lora", "--max-loras", "2",
            "--max-lora-rank", "8", "--api-key", USER, "--admin-api-key", ADMIN,
            "--kv-cache-memory", str(64 * 2**20), "--served-model-name", "tiny",
            "--lora-modules", f"qv8={adapters['qv8']}",
            f'{{"name": "mlp4", "path": "{adapters["mlp4"]}", "base_model_name": "org/tiny-base"}}',
        ]
    )  # fmt: skip
    try:
        srv.wait_ready()
        yield srv, base, adapters
    finally:
        srv.stop()


def oracle(base: str, adapter: str | None, n: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = (
        peft_model(base, adapter)
        if adapter
        else AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    )
    with torch.inference_mode():
        return hf_greedy(model, PROMPT, n)


def client(srv, key=USER) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0)


def test_models_lists_adapters_with_their_parent(setup):
    srv, _, adapters = setup
    models = {m.id: m for m in client(srv).models.list().data}
    assert set(models) == {"tiny", "qv8", "mlp4"}
    assert models["qv8"].parent == "tiny" and models["qv8"].root == adapters["qv8"]
    assert models["mlp4"].parent == "org/tiny-base"  # as --lora-modules' JSON names it
    assert getattr(models["tiny"], "parent", None) is None


def test_adapter_named_in_model_gives_peft_tokens(setup):
    srv, base, adapters = setup
    c = client(srv)
    detok = httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {USER}"})
    for name in ("qv8", "mlp4", "tiny"):
        out = c.completions.create(
            model=name, prompt=PROMPT, max_tokens=8, temperature=0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        want = oracle(base, adapters.get(name), 8)
        text = detok.post("/detokenize", json={"tokens": want}).json()["prompt"]
        assert out.model == name and out.choices[0].text == text, name
    chunks = list(
        c.chat.completions.create(
            model="qv8",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            temperature=0,
            stream=True,
        )
    )
    assert chunks and all(ch.model == "qv8" for ch in chunks)
    metrics = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in detok.get("/metrics").text.splitlines()
        if line.startswith("cadence:lora")
    }
    assert metrics['cadence:lora_slot_loads_total{model_name="tiny"}'] >= 2
    assert metrics['cadence:lora_requests_running{lora_name="qv8",model_name="tiny"}'] == 0


def test_unknown_model_is_a_404(setup):
    srv, _, _ = setup
    with pytest.raises(openai.NotFoundError) as e:
        client(srv).completions.create(model="nope", prompt="x", max_tokens=2)
    assert "`nope` does not exist" in e.value.body["message"]


def test_load_and_unload_at_run_time(setup, tmp_path):
    srv, base, adapters = setup
    admin = httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {ADMIN}"})
    user = httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {USER}"})
    body = {"lora_name": "late", "lora_path": adapters["qv8"]}
    assert user.post("/v1/load_lora_adapter", json=body).status_code == 403  # admin only
    r = admin.post("/v1/load_lora_adapter", json=body)
    assert r.status_code == 200, r.text
    out = client(srv).completions.create(model="late", prompt=PROMPT, max_tokens=4, temperature=0)
    first = client(srv).completions.create(model="qv8", prompt=PROMPT, max_tokens=4, temperature=0)
    assert out.choices[0].text == first.choices[0].text and out.model == "late"
    again = admin.post("/v1/load_lora_adapter", json=body)
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
    # rank 16 > --max-lora-rank 8; no folder; a folder of something else: 400s naming why
    for path, why in (
        (adapters["all16"], "rank 16 is above"),
        (str(tmp_path / "missing"), "not a folder"),
        (base, "no adapter_config.json"),
    ):
        r = admin.post("/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": path})
        assert r.status_code == 400 and why in r.json()["error"]["message"], r.text
    r = admin.post("/v1/load_lora_adapter", json={"lora_name": "a b", "lora_path": base})
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora_name"
    assert admin.post("/v1/unload_lora_adapter", json={"lora_name": "late"}).status_code == 200
    with pytest.raises(openai.NotFoundError):
        client(srv).completions.create(model="late", prompt=PROMPT, max_tokens=2)
    r = admin.post("/v1/unload_lora_adapter", json={"lora_name": "late"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"


def test_a_bad_adapter_at_start_stops_the_server(setup, tmp_path):
    _, base, _ = setup
    srv = Server(["--model", base, "--enable-lora", "--lora-modules", f"x={tmp_path}"])
    try:
        assert srv.proc.wait(120) != 0
    finally:
        srv.stop()


def test_the_web_chat_picks_an_adapter(setup):
    """The web UI lists the adapters beside the base model; the chat asks the one picked."""
    from browser_helper import browser_page

    srv, _, _ = setup
    with browser_page(srv.url + "/") as page:
        page.wait_for_selector("#api-key-dialog[open]", timeout=10_000)
        page.fill("#api-key-input", USER)
        page.click("#api-key-save")
        pick = page.wait_for_selector("#model-pick", timeout=20_000)
        options = [o.inner_text() for o in pick.query_selector_all("option")]
        assert options == ["tiny", "qv8 (LoRA)", "mlp4 (LoRA)"]
        page.select_option("#model-pick", "qv8")
        page.fill("#max-tokens", "4")
        page.fill("#chat-input", "hi")
        page.press("#chat-input", "Enter")
        page.wait_for_selector(".msg.assistant .meta", timeout=60_000)
        assert page.inner_text(".msg.assistant .role") == "qv8"
