#!/usr/bin/env bash
# Issue 17's GPU figures on the H200 (see benchmarks/RESULTS.md), in parts that fit the
# device tool's 10-minute calls:
#   PARTS="tests sweep" bash benchmarks/quant_h200_run.sh   GPU tests of quant/, FP8 GEMM sweep
#   PARTS=fp8                                               bf16 vs FP8 W8A8 (Llama-3.1-8B shape)
#   PARTS=kv                                                bf16 vs FP8 KV cache, long contexts
#   PARTS=kvsweep                                           FP8 KV decode tiles (one layer)
#   PARTS=acc                                               SmolLM2 accuracy (needs the GGUF
#                                                           file at $GGUF, staged in parts)
# Needs the wheels of benchmarks/device_wheels.sh in .whl/ (carry it). Logs under $OUT.
set -uo pipefail
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
source benchmarks/device_env.sh
M=benchmarks/llama-3.1-8b
BENCH="python3 -m cadence.cli.main bench"
COMMON="--load-format dummy --dtype bfloat16"
LOG="$OUT/quant.log"
PARTS=${PARTS:-tests sweep}
has() { [[ " $PARTS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$LOG"
run() {
  name=$1; shift
  echo "== $name: $*" | tee -a "$LOG"
  $BENCH "$@" 2>&1 | grep -v " INFO cadence.engine.core\|it/s\]" | tee -a "$LOG" | tail -7
}
if has tests; then
  python3 -m pytest -q -p no:cacheprovider -m gpu tests/quant tests/attention/test_fp8_kv.py \
    2>&1 | tee -a "$OUT/tests.log" | tail -3
  # FP8 checkpoints and quantization at load, on CUDA (the tiny models pick it here)
  python3 -m pytest -q -p no:cacheprovider tests/quant/test_fp8.py tests/quant/test_gguf_linear.py \
    2>&1 | tee -a "$OUT/tests.log" | tail -3
fi
if has sweep; then
  python3 benchmarks/fp8_gemm_sweep.py --rows "${ROWS:-1,8,16,32,64,128,256}" \
    --json "$OUT/fp8_sweep.json" 2>&1 | tee -a "$LOG"
fi
if has kvsweep; then
  python3 benchmarks/fp8_kv_sweep.py --json "$OUT/fp8_kv_sweep.json" 2>&1 | tee -a "$LOG"
fi
if has fp8; then
  for q in none fp8; do
    run "lat_b1_$q" latency $M $COMMON --quantization $q --batch-size 1 --input-len 128 --output-len 256 --json "$OUT/lat_b1_$q.json"
    run "lat_b64_$q" latency $M $COMMON --quantization $q --batch-size 64 --input-len 128 --output-len 256 --json "$OUT/lat_b64_$q.json"
    run "tput_1024_$q" throughput $M $COMMON --quantization $q --num-prompts 256 --input-len 1024 --output-len 256
  done
fi
if has kv; then
  for kv in auto fp8; do
    echo "== long contexts, kv cache $kv" | tee -a "$LOG"
    python3 benchmarks/long_context.py $M --cases 8x4000,1x32000 --kv-cache-dtype $kv \
      --json "$OUT/kv_$kv.json" 2>&1 | grep -v " INFO " | tee -a "$LOG"
  done
fi
if has acc; then
  python3 benchmarks/quant_accuracy.py --model "${GGUF:?the GGUF file}" --json "$OUT/acc.json" \
    2>&1 | grep -v " INFO \|WARNING" | tee -a "$LOG"
fi
