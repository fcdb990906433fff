"""Incremental detokenization with the real SmolLM2 tokenizer (byte-level: an emoji is three
tokens): the text is the same whether tokens come one at a time or several per step (as
speculation brings them), nothing is lost at a step that ends inside a character, and at
the end the text equals a whole decode."""

from __future__ import annotations

import pytest

from cadence.engine.detokenizer import IncrementalDetokenizer, StreamDetokenizer, make_detokenizer
from cadence.loader.model_path import resolve_model_path
from cadence.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model_path(None))


TEXTS = ["Hello 🌍🌍🌍 and 日本語 too — ok", "🌍" * 7, "plain words only"]


WAYS = {
    "stream": lambda tok, prompt: make_detokenizer(tok, prompt, True),  # DecodeStream
    "window": lambda tok, prompt: IncrementalDetokenizer(tok, prompt, True),
}


@pytest.fixture(params=list(WAYS))
def way(request):
    return WAYS[request.param]


def test_a_fast_tokenizer_streams_with_decode_stream(tokenizer):
    assert isinstance(make_detokenizer(tokenizer, [1], True), StreamDetokenizer)


def stream(tokenizer, ids: list[int], chunk: int, way) -> tuple[str, list[str]]:
    detok = way(tokenizer, [1, 2, 3])
    pieces = [detok.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    return "".join(pieces) + detok.flush(), pieces


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 5])
def test_steps_of_any_size_give_the_whole_decode(tokenizer, text, chunk, way):
    ids = tokenizer.encode(text, add_special_tokens=False)
    got, pieces = stream(tokenizer, ids, chunk, way)
    assert got == tokenizer.decode(ids, skip_special_tokens=True) == text
    assert all("\ufffd" not in p for p in pieces)  # never half a character


def test_text_is_not_held_back_past_the_character_it_waits_for(tokenizer, way):
    ids = tokenizer.encode("🌍" * 7, add_special_tokens=False)
    assert len(ids) == 21  # three byte tokens each
    _, pieces = stream(tokenizer, ids, 4, way)
    # Each step of 4 tokens completes at least one emoji: every step emits something.
    assert all(pieces)


def test_a_character_cut_at_the_end_reads_as_a_replacement(tokenizer, way):
    ids = tokenizer.encode("ok 🌍", add_special_tokens=False)[:-1]  # the last byte missing
    detok = way(tokenizer, [])
    shown = detok.push(ids)
    assert "\ufffd" not in shown
    assert shown + detok.flush() == tokenizer.decode(ids, skip_special_tokens=True)


def metaspace_tokenizer():
    """A SentencePiece-style tokenizer (Metaspace: `▁` marks a word's space, and a decode
    drops the space before the first word), trained here on a few words."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "</s>", *bytes_])
    tok.train_from_iterator(["hello world the quick brown fox jumps"] * 50, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>")


@pytest.mark.parametrize("kind", ["byte-level", "metaspace"])
def test_the_first_word_of_the_output_keeps_its_space(tokenizer, kind, way):
    """The output's text is what a decode of prompt + output adds to the prompt's: a
    tokenizer that drops the space before a decode's first word must not drop it here."""
    tok = tokenizer if kind == "byte-level" else metaspace_tokenizer()
    prompt = tok.encode("hello", add_special_tokens=False)
    ids = tok.encode("hello world fox", add_special_tokens=False)[len(prompt) :]
    detok = way(tok, prompt)
    got = "".join(detok.push([t]) for t in ids) + detok.flush()
    assert got == " world fox"


def test_special_tokens_are_skipped_or_kept(tokenizer):
    ids = tokenizer.encode("hi", add_special_tokens=False)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    skipping = make_detokenizer(tokenizer, [1], skip_special_tokens=True)
    keeping = make_detokenizer(tokenizer, [1], skip_special_tokens=False)
    assert skipping.push([*ids, end]) + skipping.flush() == "hi"
    assert keeping.push([*ids, end]) + keeping.flush() == "hi<|im_end|>"
