#!/usr/bin/env bash
# Issue 18's cross-check: vLLM's own client (`vllm bench serve`) against `cadence serve`
# (defaults) and vLLM's CPU build, one sitting, concurrency 1, 4, 16, random 128 -> 128,
# EOS ignored, 32 prompts a point (the same load as benchmarks/cpu_fast_path.sh):
#   bash benchmarks/cpu_vllm_client.sh [OUT_DIR]
# CONCURRENCY="1 4 16 32", NUM_PROMPTS=16 and ORDER="vllm cadence" change the sweep.
# Needs benchmarks/vllm_cpu/setup.sh's folder (VLLM_DIR, default /work/vllm-cmp).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results/cpu_fast_path}
mkdir -p "$out"
out=$(cd "$out" && pwd)  # absolute: the vLLM server starts from its own folder
vllm_dir=${VLLM_DIR:-/work/vllm-cmp}
client=("$vllm_dir/venv/bin/python" "$vllm_dir/vllm_cli.py" bench serve)

source benchmarks/serve_lib.sh  # wait_healthy

for name in ${ORDER:-cadence vllm}; do
  if [ "$name" = vllm ]; then
    port=8200
    log=$out/server_vllm_client_run.log
    (cd "$vllm_dir" && exec setsid ./start_vllm.sh > "$log" 2>&1) &
  else
    port=8766
    .venv/bin/cadence serve --port $port --log-level warning --served-model-name smollm2 \
      > "$out/server_cadence_client_run.log" 2>&1 &
  fi
  server=$!
  wait_healthy $port
  for c in ${CONCURRENCY:-1 4 16}; do
    "${client[@]}" --backend openai --base-url "http://127.0.0.1:$port" --model smollm2 \
      --tokenizer "$vllm_dir/smollm2-hf" --dataset-name random --random-input-len 128 \
      --random-output-len 128 --num-prompts "${NUM_PROMPTS:-32}" --max-concurrency $c --ignore-eos \
      --seed 0 2>&1 | sed -n '/Serving Benchmark Result/,/^====*$/p' \
      | tee "$out/vllm_client_${name}_c$c.log"
  done
  if [ "$name" = vllm ]; then kill -TERM -- -$server 2>/dev/null || true; fi
  kill $server 2>/dev/null || true
  wait $server 2>/dev/null || true
  sleep 2
done
