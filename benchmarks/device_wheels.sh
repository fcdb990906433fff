#!/usr/bin/env bash
# Wheels for the GPU machine, into .whl/ (carry it: `carry: [".whl"]`), run in the project
# root. The shared tool's default list lacks what recent releases of our dependencies import
# (xgrammar: apache-tvm-ffi; fastapi 0.165: opentelemetry-api, annotated-doc; openai 3.x:
# httpx2, httpcore2, truststore; uvicorn: click, h11), so those follow, pinned to this
# machine's .venv. A model folder for benchmarks/gpu_serve_check.py (config and tokenizer,
# no weights) goes to .gpu-smoke/smollm2 from the GGUF cadence converts on first use, and
# an 8B-shaped one to .gpu-smoke/llama8b-v49k (below).
set -euo pipefail
../shared/tools/device-wheels
pins=()
for p in apache-tvm-ffi opentelemetry-api annotated-doc httpx2 httpcore2 truststore click h11 httptools uvloop \
    aiohttp aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl; do
  v=$(.venv/bin/pip show "$p" 2>/dev/null | awk '/^Version:/{print $2}')
  [ -n "$v" ] && pins+=("$p==$v")
done
../shared/tools/device-wheels "${pins[@]}"
src=$(.venv/bin/python -c "from cadence.loader.model_path import resolve_model_path; print(resolve_model_path(None))")
mkdir -p .gpu-smoke/smollm2
grep -qx '/.gpu-smoke/' .git/info/exclude || echo '/.gpu-smoke/' >> .git/info/exclude
for f in config.json tokenizer.json tokenizer_config.json chat_template.jinja; do
  [ -f "$src/$f" ] && cp "$src/$f" .gpu-smoke/smollm2/
done
# Llama-3.1-8B's shape over SmolLM2's tokenizer, its vocabulary cut to the tokenizer's
# 49,152 (and its bos/eos): every token the dummy model samples has text, so a streaming
# client sees one token per chunk (with Llama's 128,256, 62 % of them have none and ITL
# counts several tokens per gap). benchmarks/serving_h200_run.sh serves it.
mkdir -p .gpu-smoke/llama8b-v49k
cp .gpu-smoke/smollm2/tokenizer* .gpu-smoke/smollm2/chat_template.jinja .gpu-smoke/llama8b-v49k/ 2>/dev/null || true
python3 - <<'PY'
import json
config = json.load(open("../shared/model-configs/llama-3.1-8b/config.json"))
config.update(vocab_size=49152, bos_token_id=1, eos_token_id=2)
json.dump(config, open(".gpu-smoke/llama8b-v49k/config.json", "w"), indent=1)
PY
du -sh .whl .gpu-smoke
