"""POST /v1/embeddings with the official `openai` client, against `cadence serve` of a tiny
random headless Qwen3 (an embedding model by its architecture) with SmolLM2's tokenizer:
vectors equal transformers' pooled states, in float and base64, for text and token ids,
batched beyond the admission window; Matryoshka `dimensions`; errors as OpenAI objects."""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest
import torch
import torch.nn.functional as F
from server_helper import Server

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings map text to vectors.",
    "A",
    "Paris is the capital of France, and Rome is the capital of Italy; both are old cities.",
]
TOL = 2e-5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    import transformers as tf
    from model_helpers import TINY

    torch.manual_seed(0)
    config = tf.Qwen3Config(**{**TINY, "vocab_size": 49152}, head_dim=32)
    config.matryoshka_dimensions = [16, 32]
    path = tmp_path_factory.mktemp("tiny-qwen3-embedding")
    tf.Qwen3Model(config).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def embed_server(model_dir):
    from cadence.loader.model_path import resolve_model_path

    srv = Server(
        [
            model_dir,
            "--tokenizer",
            resolve_model_path(None),
            "--dtype",
            "float32",
            "--max-num-seqs",
            "2",
            "--max-num-waiting",
            "2",  # an admission window of 2: a batch of 12 runs in waves
            "--max-num-batched-tokens",
            "16",  # prompts longer than that prefill in chunks
            "--num-gpu-blocks-override",
            "256",
            "--max-model-len",
            "256",
        ]
    )
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def oai(embed_server):
    return openai.OpenAI(base_url=embed_server.url + "/v1", api_key="-", max_retries=0)


@pytest.fixture(scope="module")
def reference(model_dir):
    """text or ids -> transformers' last-token state, L2-normalized (the default pooling)."""
    from transformers import AutoModel, AutoTokenizer

    from cadence.loader.model_path import resolve_model_path

    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(resolve_model_path(None))

    def vector(x, dims: int | None = None) -> np.ndarray:
        ids = tok.encode(x) if isinstance(x, str) else x
        with torch.no_grad():
            last = model(torch.tensor([ids])).last_hidden_state[0, -1]
        return F.normalize(last[:dims] if dims else last, dim=-1).numpy()

    return vector


def close(got, want) -> bool:
    return np.abs(np.asarray(got, dtype=np.float32) - want).max() < TOL


def test_batched_text_equals_transformers_in_both_encodings(oai, embed_server, reference):
    inputs = TEXTS * 3  # 12 inputs through a window of 2
    r = oai.embeddings.create(model=embed_server_model(oai), input=inputs)  # the SDK: base64
    assert [d.index for d in r.data] == list(range(12))
    for text, d in zip(inputs, r.data):
        assert len(d.embedding) == 64 and close(d.embedding, reference(text))
    f = oai.embeddings.create(model=r.model, input=TEXTS, encoding_format="float")
    for text, d in zip(TEXTS, f.data):  # (other batches: the same up to float rounding)
        assert close(d.embedding, reference(text))
    assert r.usage.prompt_tokens == r.usage.total_tokens == 3 * f.usage.prompt_tokens


def embed_server_model(oai) -> str:
    return oai.models.list().data[0].id


def test_base64_is_little_endian_float32(embed_server, reference):
    import httpx

    body = {"input": TEXTS[1], "encoding_format": "base64"}
    r = httpx.post(embed_server.url + "/v1/embeddings", json=body, timeout=60).json()
    vec = np.frombuffer(base64.b64decode(r["data"][0]["embedding"]), dtype="<f4")
    assert vec.shape == (64,) and close(vec, reference(TEXTS[1]))


def test_token_id_inputs(oai, reference):
    ids = [[1, 2, 3, 4, 5], list(range(100, 140))]
    r = oai.embeddings.create(model=embed_server_model(oai), input=ids, encoding_format="float")
    for x, d in zip(ids, r.data):
        assert close(d.embedding, reference(x))
    one = oai.embeddings.create(model=r.model, input=ids[0], encoding_format="float")
    assert close(one.data[0].embedding, reference(ids[0]))
    cut = oai.embeddings.create(
        model=r.model,
        input=ids[1],
        encoding_format="float",
        extra_body={"truncate_prompt_tokens": 8},
    )
    assert close(cut.data[0].embedding, reference(ids[1][-8:]))
    long = list(range(1, 301))  # past the context (256): -1 keeps what fits
    fit = oai.embeddings.create(
        model=r.model,
        input=long,
        encoding_format="float",
        extra_body={"truncate_prompt_tokens": -1},
    )
    assert fit.usage.prompt_tokens == 255 and close(fit.data[0].embedding, reference(long[-255:]))


def test_matryoshka_dimensions(oai, reference):
    r = oai.embeddings.create(
        model=embed_server_model(oai), input=TEXTS[0], dimensions=16, encoding_format="float"
    )
    assert len(r.data[0].embedding) == 16 and close(r.data[0].embedding, reference(TEXTS[0], 16))
    with pytest.raises(openai.BadRequestError, match="trained for"):
        oai.embeddings.create(model=r.model, input=TEXTS[0], dimensions=20)


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"input": ""}, "empty string"),
        ({"input": []}, "must not be empty"),
        ({"input": [[]]}, "no tokens"),
        ({"input": [[1, 2, 49152]]}, "outside the vocabulary"),
        ({"input": [[1] * 300]}, "maximum context length"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"input": ["x"] * 2049}, "at most 2048"),
    ],
)
def test_bad_inputs_are_400s(embed_server, body, needle):
    import httpx

    r = httpx.post(embed_server.url + "/v1/embeddings", json=body, timeout=60)
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text


def test_an_embedding_model_refuses_generation_and_a_generator_refuses_embeddings(
    oai, client, model_name
):
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        oai.chat.completions.create(
            model=embed_server_model(oai), messages=[{"role": "user", "content": "hi"}]
        )
    with pytest.raises(openai.BadRequestError, match="served for generation"):
        client.embeddings.create(model=model_name, input="hi")
