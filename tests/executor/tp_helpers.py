"""Shared by the tensor-parallel tests: greedy runs, and a tiny model that has a tokenizer."""

from __future__ import annotations

import contextlib
import shutil

import torch
from model_helpers import TINY, hf_greedy, make_prompts

from cadence import LLM, SamplingParams

NEW_TOKENS = 12
PROMPT_LENS = [5, 17, 40]
CPU = dict(dtype="float32", device="cpu", kv_cache_memory=2**24)


def greedy(llm: LLM, prompts: list[list[int]], max_tokens: int = NEW_TOKENS) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def hf_reference(model, prompts: list[list[int]], max_tokens: int = NEW_TOKENS):
    return [hf_greedy(model, p, max_tokens) for p in prompts]


def prompts_for(path: str) -> list[list[int]]:
    import json
    import os

    with open(os.path.join(path, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    return make_prompts(vocab, PROMPT_LENS)


def save_tiny_with_tokenizer(out: str) -> str:
    """A tiny random Llama over SmolLM2's tokenizer (its 49,152-token vocabulary), so text,
    chat and structured outputs work on it; 2 ranks split its 4 heads."""
    import transformers as tf

    from cadence.loader.model_path import resolve_model_path

    src = resolve_model_path(None)
    config = tf.LlamaConfig(**{**TINY, "vocab_size": 49152}, tie_word_embeddings=True)
    torch.manual_seed(0)
    tf.LlamaForCausalLM(config).eval().save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        with contextlib.suppress(FileNotFoundError):
            shutil.copy(f"{src}/{name}", f"{out}/{name}")
    return out
