"""SmolLM2's GGUF file (the one `cadence serve` serves) as a Hugging Face folder with bf16
safetensors, for servers that read only that format (vLLM's CPU build):

    .venv/bin/python benchmarks/vllm_cpu/convert.py OUT_DIR
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from cadence.loader.gguf import convert_gguf, default_model_path, ensure_float_weights


def main() -> None:
    out = Path(sys.argv[1])
    folder = Path(convert_gguf(default_model_path()))
    ensure_float_weights(folder)  # float32 safetensors beside the config, once
    out.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        if f.name not in ("model.safetensors", "gguf_source") and not f.name.startswith("."):
            shutil.copy(f, out / f.name)
    config = json.loads((out / "config.json").read_text())
    config["dtype"] = "bfloat16"
    config.pop("torch_dtype", None)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = load_file(str(folder / "model.safetensors"))
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}
    tensors.pop("lm_head.weight", None)  # tied to the embedding
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    print(f"{len(tensors)} tensors written to {out}")


if __name__ == "__main__":
    main()
