#!/usr/bin/env bash
# Issue 19's GPU figures on the H200 (benchmarks/RESULTS.md, "The engine view"):
#   1. what the step timeline costs: Llama-3.1-8B shape, dummy weights, batch 1 and 64,
#      timeline on/off alternating in one engine (benchmarks/step_timeline_cost.py);
#   2. the engine view's data under load on the GPU, and a CUDA profiler trace
#      (benchmarks/engine_view_check.py, SmolLM2's shape with dummy weights).
# Needs .whl/ and .gpu-smoke/ from benchmarks/device_wheels.sh (carry both). Logs in $OUT.
set -uo pipefail
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 benchmarks/step_timeline_cost.py benchmarks/llama-3.1-8b --load-format dummy \
  --dtype bfloat16 --batch-sizes 1,64 --rounds 4 --json "$OUT/timeline_cost.json" \
  2>&1 | grep -v " INFO " | tee "$OUT/timeline_cost.log" | tail -4
for c in 1 32; do
  python3 benchmarks/engine_view_check.py .gpu-smoke/smollm2 --concurrency $c --seconds 16 \
    --json "$OUT/engine_view_c$c.json" -- --load-format dummy --dtype bfloat16 \
    2>&1 | grep -v " INFO \|POST\|GET" | tee "$OUT/engine_view_c$c.log" | tail -30
done
