"""Embedding models offline (`LLM.embed`): each pooling equals transformers' own hidden
states pooled the same way (float32), whatever the chunking, batch or preemption; the
pooling comes from --pooler-config or the checkpoint's sentence-transformers files;
Matryoshka lengths only where the config names them."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from model_helpers import make_prompts

from cadence.llm import LLM
from cadence.worker.pooling import PoolingState

TOL = 2e-5  # float32, the same math in another order


@pytest.fixture(scope="module")
def embed_dir(tiny_model_dir):
    return tiny_model_dir("qwen3-embed")


@pytest.fixture(scope="module")
def reference(embed_dir):
    """prompt ids -> transformers' last hidden states [P, hidden] (float32)."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(embed_dir, dtype=torch.float32).eval()

    def states(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return model(torch.tensor([ids])).last_hidden_state[0]

    return states


def pooled(states: torch.Tensor, kind: str, normalize: bool = True, dims: int | None = None):
    vec = {"LAST": states[-1], "MEAN": states.mean(0), "CLS": states[0]}[kind]
    vec = vec[:dims] if dims else vec
    return F.normalize(vec, dim=-1) if normalize else vec


def engine(path: str, **kw) -> LLM:
    kw.setdefault("max_num_batched_tokens", 16)  # prompts of up to 90 tokens: chunked
    return LLM(path, dtype="float32", device="cpu", skip_tokenizer_init=True, **kw)


PROMPTS = make_prompts(512, [1, 5, 16, 17, 40, 90], seed=3)


@pytest.mark.parametrize("kind", ["LAST", "MEAN", "CLS"])
def test_each_pooling_equals_transformers_chunked_and_batched(embed_dir, reference, kind):
    config = None if kind == "LAST" else json.dumps({"pooling_type": kind})
    with engine(embed_dir, pooler_config=config) as llm:
        assert llm.engine.pooling.pooling_type == kind
        # MEAN and CLS read every prompt position: no prefix-cache hits for them
        assert llm.config.cache.enable_prefix_caching == (kind == "LAST")
        batch = llm.embed(PROMPTS, use_tqdm=False)
        alone = [llm.embed(p, use_tqdm=False)[0] for p in PROMPTS[::-1]][::-1]
        again = llm.embed(PROMPTS, use_tqdm=False)  # LAST: prefix-cache hits this time
    for p, *outs in zip(PROMPTS, batch, alone, again):
        want = pooled(reference(p), kind)
        for out in outs:
            got = torch.tensor(out.outputs.embedding)
            assert got.shape == (64,) and (got - want).abs().max() < TOL, (kind, len(p))
        assert outs[0].prompt_token_ids == p
    if kind != "LAST":  # the same batch computed the same way: the same bits
        assert [o.outputs.embedding for o in batch] == [o.outputs.embedding for o in again]


def test_a_tight_pool_gives_the_same_vectors(embed_dir, reference):
    long = make_prompts(512, [90, 85, 70, 60], seed=4)  # 8 blocks of 16 tokens: one at a time
    config = json.dumps({"pooling_type": "MEAN", "normalize": False})
    with engine(embed_dir, pooler_config=config, num_gpu_blocks_override=8) as llm:
        outs = llm.embed(long, use_tqdm=False)
    for p, o in zip(long, outs):
        want = pooled(reference(p), "MEAN", normalize=False)
        assert (torch.tensor(o.outputs.embedding) - want).abs().max() < TOL


def test_a_recomputed_prompt_counts_each_position_once():
    """Preemption by recompute runs a prompt's chunks again: MEAN must not add them twice."""
    hidden = torch.arange(40 * 3, dtype=torch.float32).reshape(40, 3)
    state = PoolingState("MEAN", 40)
    state.fold(hidden[0:16], 0, 0, 16)
    state.fold(hidden[16:32], 0, 16, 32)
    state.fold(hidden[0:16], 0, 0, 16)  # preempted: the prompt again from position 0
    state.fold(hidden[16:41], 0, 16, 41)  # ... and on past it (its sampled token's row)
    want = hidden.mean(0)
    got = torch.frombuffer(bytearray(state.take()), dtype=torch.float32)
    assert torch.equal(got, want)
    last = PoolingState("LAST", 40)
    last.fold(hidden[30:41], 0, 30, 41)
    assert torch.equal(torch.frombuffer(bytearray(last.take()), dtype=torch.float32), hidden[39])


def test_matryoshka_dimensions(embed_dir, reference):
    with engine(embed_dir) as llm:
        (out,) = llm.embed(PROMPTS[3], dimensions=16, use_tqdm=False)
        want = pooled(reference(PROMPTS[3]), "LAST", dims=16)
        assert (torch.tensor(out.outputs.embedding) - want).abs().max() < TOL
        with pytest.raises(ValueError, match="trained for"):
            llm.embed(PROMPTS[3], dimensions=20)
        with pytest.raises(ValueError, match="use LLM.embed"):
            llm.generate(PROMPTS[3])


def test_sentence_transformers_files_set_the_pooling(embed_dir, reference, tmp_path):
    path = tmp_path / "st"
    shutil.copytree(embed_dir, path)
    (path / "modules.json").write_text(
        json.dumps(
            [
                {
                    "idx": 0,
                    "name": "0",
                    "path": "",
                    "type": "sentence_transformers.models.Transformer",
                },
                {
                    "idx": 1,
                    "name": "1",
                    "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling",
                },
            ]
        )
    )  # fmt: skip  (no Normalize module: vectors are left as pooled)
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 64, "pooling_mode_mean_tokens": True})
    )
    with engine(str(path)) as llm:
        spec = llm.engine.pooling
        assert (spec.pooling_type, spec.normalize) == ("MEAN", False)
        (out,) = llm.embed(PROMPTS[4], use_tqdm=False)
    want = pooled(reference(PROMPTS[4]), "MEAN", normalize=False)
    assert (torch.tensor(out.outputs.embedding) - want).abs().max() < TOL
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    with pytest.raises(ValueError, match="pooling_mode_max_tokens"):
        engine(str(path))


def test_checkpoints_we_would_embed_wrongly_are_refused(embed_dir, tmp_path):
    path = tmp_path / "st"
    shutil.copytree(embed_dir, path)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]  # fmt: skip
    (path / "modules.json").write_text(json.dumps([*modules, {"path": "2_Dense", "type": "sentence_transformers.models.Dense"}]))  # fmt: skip
    with pytest.raises(ValueError, match="Dense"):
        engine(str(path))
    (path / "modules.json").write_text(json.dumps([modules[0], {**modules[1], "path": "../../etc"}]))  # fmt: skip
    with pytest.raises(ValueError, match="outside the model folder"):
        engine(str(path))
    # A hub-cache snapshot: the pooling config is a link into the cache's blob store.
    (path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "blob").write_text(json.dumps({"pooling_mode_cls_token": True}))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").symlink_to(tmp_path / "blob")
    with engine(str(path)) as llm:
        assert llm.engine.pooling.pooling_type == "CLS"
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "is_causal": False}))
    with pytest.raises(ValueError, match="bidirectional"):
        engine(str(path))


def test_runner_pooling_turns_a_causal_lm_into_an_embedding_model(tiny_model_dir, hf_model):
    path = tiny_model_dir("llama")
    with engine(path, runner="pooling") as llm:
        (out,) = llm.embed(PROMPTS[2], use_tqdm=False)
        with pytest.raises(ValueError, match="no speculative"):
            engine(path, runner="pooling", speculative_config={"method": "ngram", "num_speculative_tokens": 2})  # fmt: skip
    with torch.no_grad():
        states = hf_model(path).model(torch.tensor([PROMPTS[2]])).last_hidden_state[0]
    assert (torch.tensor(out.outputs.embedding) - pooled(states, "LAST")).abs().max() < TOL
    with engine(path) as llm, pytest.raises(ValueError, match="served for generation"):
        llm.embed(PROMPTS[2])


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"runner": "embed"}, "runner must be"),
        ({"pooler_config": "{"}, "not valid JSON"),
        ({"pooler_config": '{"pooling_type": "MAX"}'}, "pooling_type"),
        ({"pooler_config": '{"dimensions": 3}'}, "unknown keys"),
    ],
)
def test_bad_pooling_settings_are_clear_errors(embed_dir, kw, needle):
    with pytest.raises(ValueError, match=needle):
        engine(embed_dir, **kw)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", ["LAST", "MEAN"])
def test_cuda_graphs_and_async_scheduling_pool_the_same(embed_dir, reference, kind):
    """On a GPU: async scheduling (the vector read a step later) and prefill steps replayed
    from CUDA graphs (their output buffer reused) give transformers' vectors."""
    config = json.dumps({"pooling_type": kind})
    with LLM(embed_dir, dtype="float32", skip_tokenizer_init=True, pooler_config=config,
             max_num_batched_tokens=64, cuda_graph_prefill=True) as llm:  # fmt: skip
        assert llm.config.scheduler.async_scheduling
        batch = llm.embed(PROMPTS, use_tqdm=False)
        again = llm.embed(PROMPTS[::-1], use_tqdm=False)[::-1]
    for p, *outs in zip(PROMPTS, batch, again):
        want = pooled(reference(p), kind)
        for out in outs:
            assert (torch.tensor(out.outputs.embedding) - want).abs().max() < 1e-4, len(p)
