"""Loading the tokenizer that comes with a checkpoint (or none, for tokenizer-less tests)."""

from __future__ import annotations

import json
import os

# Classes that are the plain `tokenizers`-backed tokenizer itself (transformers 5 names it
# TokenizersBackend; PreTrainedTokenizerFast is its alias): what AutoTokenizer would build
# for them, built without AutoTokenizer's import of PyTorch (2-3 CPU seconds at every API
# server start, where nothing else needs it).
_PLAIN_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


def load_tokenizer(path: str | None):
    """The Hugging Face tokenizer in `path`, or None if the folder has none."""
    if path is None:
        return None
    names = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")
    if not any(os.path.exists(os.path.join(path, n)) for n in names):
        return None
    if _plain_class(path):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _plain_class(path: str) -> bool:
    """Whether the folder's tokenizer_config.json names a plain tokenizer.json tokenizer."""
    config = os.path.join(path, "tokenizer_config.json")
    if not os.path.exists(os.path.join(path, "tokenizer.json")) or not os.path.exists(config):
        return False
    try:
        with open(config) as f:
            return json.load(f).get("tokenizer_class") in _PLAIN_CLASSES
    except (OSError, ValueError):
        return False
