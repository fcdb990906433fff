"""Speculation with the real SmolLM2 and its tokenizer: greedy output is unchanged with
structured outputs (drafts the grammar forbids never reach the target), stop strings,
n > 1 and chat prompts, for n-gram lookup and a draft model."""

from __future__ import annotations

import json

import jsonschema
import pytest

from cadence import LLM, SamplingParams
from cadence.loader.model_path import resolve_model_path
from cadence.sampling_params import StructuredOutputsParams

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "colors": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "count": {"type": "integer"},
    },
    "required": ["name", "colors", "count"],
}
COPY_PROMPT = (
    "Copy this list exactly, one item per line:\n- red apples\n- green pears\n"
    "- yellow bananas\n- red apples\n- green pears\n"
)


def engines() -> dict[str, LLM]:
    common = {"dtype": "float32", "kv_cache_memory": 128 * 2**20}
    return {
        "off": LLM(**common),
        "ngram": LLM(
            **common,
            speculative_config={
                "method": "ngram",
                "num_speculative_tokens": 4,
                "prompt_lookup_min": 1,
            },
        ),
        "draft_model": LLM(
            **common,
            speculative_config={"model": resolve_model_path(None), "num_speculative_tokens": 3},
        ),
    }


@pytest.fixture(scope="module")
def llms():
    return engines()


@pytest.fixture(scope="module")
def without_speculation(llms):
    """texts() from the engine without speculation, computed once per test (the baseline
    both methods are compared with)."""
    cache: dict[str, list[list[str]]] = {}

    def baseline(name: str, params: SamplingParams) -> list[list[str]]:
        if name not in cache:
            cache[name] = texts(llms["off"], params)
        return cache[name]

    return baseline


def texts(llm: LLM, params: SamplingParams, n_prompts: int = 3) -> list[list[str]]:
    conversations = [
        [{"role": "user", "content": COPY_PROMPT}],
        [{"role": "user", "content": "Describe a fruit basket as JSON."}],
        [{"role": "user", "content": "Say hello in three languages."}],
    ][:n_prompts]
    outs = llm.chat(conversations, params, use_tqdm=False)
    return [[c.text for c in o.outputs] for o in outs]


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_structured_output_is_unchanged_and_valid(llms, without_speculation, method):
    so = StructuredOutputsParams(json=SCHEMA)
    params = SamplingParams(temperature=0, max_tokens=80, structured_outputs=so)
    want = without_speculation("structured", params)
    got = texts(llms[method], params)
    assert got == want
    for (text,) in got:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert llms[method].engine.scheduler.spec_stats.num_verifications > 0


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_stop_strings_and_n_are_unchanged(llms, without_speculation, method):
    params = SamplingParams(temperature=0, max_tokens=40, n=2, stop=["bananas"])
    want = without_speculation("stop_and_n", params)
    got = texts(llms[method], params)
    assert got == want
    assert all(len(samples) == 2 for samples in got)
    assert "bananas" not in got[0][0]
