"""Loading the tokenizer that comes with a checkpoint (or none, for tokenizer-less tests)."""

from __future__ import annotations

import os


def load_tokenizer(path: str | None):
    """The Hugging Face tokenizer in `path`, or None if the folder has none."""
    if path is None:
        return None
    names = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")
    if not any(os.path.exists(os.path.join(path, n)) for n in names):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)
