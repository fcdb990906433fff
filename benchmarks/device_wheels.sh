#!/usr/bin/env bash
# Wheels for the GPU machine, into .whl/ (carry it: `carry: [".whl"]`), run in the project
# root. The shared tool's default list lacks what recent releases of our dependencies import
# (xgrammar: apache-tvm-ffi; fastapi 0.165: opentelemetry-api, annotated-doc; openai 3.x:
# httpx2, httpcore2, truststore; uvicorn: click, h11), so those follow, pinned to this
# machine's .venv. A model folder for benchmarks/gpu_serve_check.py (config and tokenizer,
# no weights) goes to .gpu-smoke/smollm2 from the GGUF cadence converts on first use.
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
du -sh .whl .gpu-smoke
