#!/usr/bin/env bash
# Issue 17's CPU figures: SmolLM2-135M-Instruct served from its GGUF blocks (Q4_1, kept
# packed) against the same file expanded to bf16 (the float path), one sitting:
#   bash benchmarks/quant_cpu.sh [OUT_DIR]
# `cadence serve` (512 MiB KV pool, so the weights show in the RSS) + `cadence bench serve
# --sweep 1,4,16`, random 128 -> 128, EOS ignored, 32 prompts a point; the server's RSS
# (its process tree, sampled every 2 s) is in each point's "soak.rss"; then the engine
# process's own RSS by format (benchmarks/quant_rss.py) and the teacher-forced accuracy of
# benchmarks/quant_accuracy.py on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results}
mkdir -p "$out"
port=8766
bin=.venv/bin/cadence
source benchmarks/serve_lib.sh  # wait_healthy
for cfg in "gguf:--quantization gguf" "bf16:--quantization none --dtype bfloat16"; do
  name=${cfg%%:*}; flags=${cfg#*:}
  # shellcheck disable=SC2086
  $bin serve --port $port --log-level warning --kv-cache-memory 512MiB $flags &
  server=$!
  wait_healthy $port
  $bin bench serve --port $port --sweep 1,4,16 --num-prompts 32 --random-input-len 128 \
    --random-output-len 128 --ignore-eos --server-pid $server --rss-interval 2 \
    --save-json "$out/quant_cpu_$name.json" 2>&1 | grep -v " INFO " | tee "$out/quant_cpu_$name.log"
  kill $server; wait $server || true
done
.venv/bin/python benchmarks/quant_rss.py gguf none 2>&1 | tee "$out/quant_rss_cpu.log"
.venv/bin/python benchmarks/quant_accuracy.py --device cpu --configs gguf,gguf32,fp8_kv \
  --json "$out/quant_accuracy_cpu.json" 2>&1 | grep -v " INFO \|WARNING\|clean_up" \
  | tee "$out/quant_accuracy_cpu.log"
