"""Bad input raises an exception that names the problem; the engine keeps serving."""

from __future__ import annotations

import json
import shutil

import pytest

from cadence import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(
        tiny_model_dir("llama"), dtype="float32", num_gpu_blocks_override=256, max_model_len=128
    )


def ok(llm):
    out = llm.generate(
        {"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=3, ignore_eos=True)
    )
    assert len(out[0].outputs[0].token_ids) == 3


@pytest.mark.parametrize(
    "params, match",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=-3), "max_tokens"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(temperature=-1.0), "temperature"),
        (dict(n=0), "n "),
        (dict(min_p=2.0), "min_p"),
        (dict(logprobs=99), "logprobs"),
        (dict(logit_bias={10**6: 1.0}), "logit_bias"),
        (dict(stop_token_ids=[-1]), "stop_token_ids"),
        (dict(min_tokens=9, max_tokens=3), "min_tokens"),
    ],
)
def test_bad_sampling_params_are_named(llm, params, match):
    with pytest.raises(ValueError, match=match):
        llm.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(**params))
    ok(llm)


def test_prompt_longer_than_context(llm):
    with pytest.raises(ValueError, match="prompt has 200 tokens"):
        llm.generate({"prompt_token_ids": [1] * 200})
    ok(llm)


def test_bad_prompts(llm):
    with pytest.raises(ValueError, match="empty"):
        llm.generate({"prompt_token_ids": []})
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate({"prompt_token_ids": [1, 99999]})
    with pytest.raises(ValueError, match="tokenizer"):
        llm.generate("text needs a tokenizer; the tiny model has none")
    ok(llm)


def test_one_bad_request_in_a_batch_adds_nothing(llm):
    with pytest.raises(ValueError):
        llm.generate(
            [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [1] * 500}],
            SamplingParams(max_tokens=2),
        )
    assert not llm.engine.has_unfinished_requests()
    ok(llm)


def test_missing_model_path():
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM("/nonexistent/model/folder")


def test_unknown_architecture(tiny_model_dir, tmp_path):
    src = tiny_model_dir("llama")
    dst = tmp_path / "weird"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["architectures"] = ["FooBarForCausalLM"]
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="FooBarForCausalLM"):
        LLM(str(dst))


def test_bad_engine_arguments(tiny_model_dir):
    with pytest.raises(TypeError, match="no_such_flag"):
        LLM(tiny_model_dir("llama"), no_such_flag=1)
    with pytest.raises(ValueError, match="dtype"):
        LLM(tiny_model_dir("llama"), dtype="int3")
    with pytest.raises(ValueError, match="max_model_len"):
        LLM(tiny_model_dir("llama"), max_model_len=10**6)
