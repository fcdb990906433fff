"""The API server process never imports PyTorch: it resolves the model's folder, loads the
tokenizer and templates chats, all without it (importing it cost every server start 2-3
CPU seconds; the engine process is where the model lives)."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import cadence.entrypoints.api_server
from cadence.loader.model_path import resolve_model_path
from cadence.tokenizer import load_tokenizer

tok = load_tokenizer(resolve_model_path(None))
text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                               add_generation_prompt=True)
assert tok.decode(tok(text)["input_ids"]) == text
print(type(tok).__name__, "torch" in sys.modules)
"""


def test_the_api_process_path_imports_no_torch():
    out = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120, check=True
    ).stdout.split()
    assert out == [out[0], "False"], out
