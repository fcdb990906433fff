#!/usr/bin/env bash
# Issue 32's first GPU check, one lease: the MoE kernels' and the MoE zoo's GPU tests, then
# Qwen3-30B-A3B (dummy bf16) at batch 1 and 64, 128 -> 256 (`cadence bench latency`).
#   OUT=moe-out bash benchmarks/moe_h200_run.sh      (carry .whl)
set -uo pipefail
OUT=${OUT:-moe-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
source benchmarks/device_env.sh
python3 -m pytest -q -m gpu tests/ops/test_fused_moe.py tests/worker/test_cuda_runner.py \
  -k "moe or mixtral" -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/tests.log"
for b in 1 64; do
  python3 -m cadence.cli.main bench latency benchmarks/qwen3-30b-a3b --load-format dummy \
    --dtype bfloat16 --batch-size "$b" --input-len 128 --output-len 256 --num-iters 2 \
    --json "$OUT/qwen3moe_b$b.json" > "$OUT/qwen3moe_b$b.log" 2>&1
  grep -E "^decode|loaded|captured|Error" "$OUT/qwen3moe_b$b.log" | tail -5
done
