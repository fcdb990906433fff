#!/usr/bin/env bash
# Issue 33's GPU runs, in parts so each fits one device call (carry .whl: run
# benchmarks/device_wheels.sh, then ../shared/tools/device-wheels peft accelerate psutil):
#   PARTS="tests"       the LoRA GPU tests: the Triton products against torch, and the
#                       engine (decode graphs, mixed graphs, eager) against transformers + peft
#   PARTS="base lora"   Llama-3.1-8B's shape, dummy bf16: batch 64 at 128 -> 256, the base
#                       engine, then the LoRA engine with 0, 1, 8 and 32 distinct rank-16
#                       adapters on every projection (--max-loras 8); start-up of each
#   OUT=lora-out PARTS=... bash benchmarks/lora_h200_run.sh
set -uo pipefail
OUT=${OUT:-lora-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
source benchmarks/device_env.sh
PARTS=${PARTS:-tests}
has() { [[ " $PARTS " == *" $1 "* ]]; }
LOG="$OUT/lora.log"
if has tests; then
  python3 -m pytest -q -m gpu tests/ops/test_lora_kernels.py tests/lora/test_lora_engine.py \
    -p no:cacheprovider 2>&1 | tail -15 | tee -a "$LOG"
fi
for mode in base lora; do
  if has $mode; then
    t0=$SECONDS
    python3 benchmarks/lora_throughput.py benchmarks/llama-3.1-8b --mode $mode \
      --json "$OUT/lora_$mode.json" > "$OUT/lora_$mode.log" 2>&1
    grep -E "^\{|start|ready|Error|error" "$OUT/lora_$mode.log" | tail -12 | tee -a "$LOG"
    echo "   $mode ($((SECONDS - t0)) s)" | tee -a "$LOG"
  fi
done
