#!/usr/bin/env bash
# Issue 38's "at least llama.cpp at one and four users": `cadence serve` (defaults: the GGUF
# file's blocks in panels) against llama-cpp-python's server on the same GGUF file, both
# driven by the same client (`cadence bench serve`: random 128 -> 128, EOS ignored, seed 0),
# one sitting, in ORDER (default "llamacpp cadence"; run again reversed):
#   bash benchmarks/cpu_llamacpp.sh OUT_DIR
# LLAMACPP_PY: the python of a venv with llama-cpp-python[server] (benchmarks/README.md);
# CONCURRENCY (default "1 4"), NUM_PROMPTS (default: 8 at c=1, else 4 x c); MODEL: another
# .gguf file (default: SmolLM2's; benchmarks/gguf_moe_file.py writes a mixture of experts).
# llama.cpp's server does not honour ignore_eos, so its rows count the tokens it returned.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: cpu_llamacpp.sh OUT_DIR}
mkdir -p "$out"
source benchmarks/serve_lib.sh  # wait_healthy
model=$(.venv/bin/python -c 'import sys; from cadence.loader.model_path import resolve_model_path as r
print(r(sys.argv[1] or None))' "${MODEL:-}")
for name in ${ORDER:-llamacpp cadence}; do
  log=$out/server_$name.log
  case $name in
    cadence)
      port=8766
      .venv/bin/cadence serve ${MODEL:+"$MODEL"} --port $port --log-level warning --served-model-name smollm2 \
        > "$log" 2>&1 &
      ready=/health ;;
    llamacpp)
      port=8300
      "${LLAMACPP_PY:-/work/llamacpp-venv/bin/python}" benchmarks/llamacpp_server.py \
        --model "$(cat "$model/gguf_source")" --model_alias smollm2 --host 127.0.0.1 \
        --port $port --n_threads "$(nproc)" --n_ctx 4096 > "$log" 2>&1 &
      ready=/v1/models ;;  # (llama-cpp-python has no /health)
    *) echo "unknown server $name" >&2; exit 2 ;;
  esac
  server=$!
  wait_healthy $port $ready
  bench=(.venv/bin/cadence bench serve --base-url "http://127.0.0.1:$port" --model smollm2
         --tokenizer "$model" --dataset-name random --random-input-len 128
         --random-output-len 128 --ignore-eos --seed 0)
  "${bench[@]}" --max-concurrency 1 --num-prompts 2 > /dev/null 2>&1  # warm-up
  for c in ${CONCURRENCY:-1 4}; do
    n=${NUM_PROMPTS:-$(( c == 1 ? 8 : 4 * c ))}
    "${bench[@]}" --max-concurrency "$c" --num-prompts "$n" > "$out/${name}_c$c.log" 2>&1
    echo "$name c=$c: $(grep -E 'Output token throughput|Total generated|Median TTFT|Median TPOT' \
      "$out/${name}_c$c.log" | tr -s ' ' | paste -sd ';')"
  done
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  sleep 2
done
