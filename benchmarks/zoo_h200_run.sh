#!/usr/bin/env bash
# Issue 31's GPU check, in one lease: the zoo's tests on CUDA, Llama-3.1-8B before and after
# the model-layer refactor (.gpu-before/cadence: the tree before it, from `git archive`),
# then the new families' shapes with dummy weights:
#   rm -rf .gpu-before && mkdir .gpu-before && git archive 275b883 cadence | tar -x -C .gpu-before
#   PARTS=tests bash benchmarks/zoo_h200_run.sh     (carry .whl and .gpu-before)
#   PARTS=lat bash benchmarks/zoo_h200_run.sh ; PARTS=zoo bash benchmarks/zoo_h200_run.sh
# Results under $OUT (or ./zoo-out).
set -uo pipefail
OUT=${OUT:-zoo-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
source benchmarks/device_env.sh
ROOT=$PWD
COMMON="--load-format dummy --dtype bfloat16"
PARTS=${PARTS:-tests lat zoo}
has() { [[ " $PARTS " == *" $1 "* ]]; }
LOG="$OUT/zoo.log"
tree() {
  local name=$1; shift
  local dir=$ROOT; [ "$name" = before ] && dir=$ROOT/.gpu-before
  (cd "$dir" && PYTHONPATH=/tmp/site:$dir "$@")
}
lat() {  # lat NAME TREE MODEL BATCH [flags]: one `bench latency` at 128 -> 256
  local name=$1 which=$2 model=$3 b=$4; shift 4
  echo "== $name b$b $which" | tee -a "$LOG"
  tree "$which" python3 -m cadence.cli.main bench latency "$ROOT/benchmarks/$model" $COMMON \
    --batch-size "$b" --input-len 128 --output-len 256 --num-iters 2 "$@" \
    --json "$OUT/${name}_b${b}_$which.json" 2>&1 | grep -v " INFO \|it/s\]" | tail -3 | tee -a "$LOG"
}
if has tests; then
  python3 -m pytest -q tests/models -p no:cacheprovider 2>&1 | tee -a "$OUT/tests.log" | tail -3
  for t in tests/worker/test_cuda_runner.py tests/attention/test_triton_paged.py; do
    python3 -m pytest -q -m gpu "$t" -p no:cacheprovider 2>&1 | tee -a "$OUT/tests.log" | tail -2
  done
  python3 -m pytest -q tests/engine/test_correctness.py tests/spec_decode/test_eagle3.py \
    -p no:cacheprovider 2>&1 | tee -a "$OUT/tests.log" | tail -3
fi
if has lat; then
  for b in 1 64; do
    for which in before after before after; do lat llama "$which" llama-3.1-8b "$b"; done
  done
fi
if has zoo; then
  # Mistral at 4,096 tokens: its window covers every sequence, so the Triton path runs.
  for b in 1 64; do lat mistral after mistral-7b-v0.1 "$b" --max-model-len 4096; done
  # Gemma 2 (soft-caps, windows) and Phi-3 (window 2,047 < 4,096; head dim 96): the torch
  # backend, until the Triton kernels take windows, soft-caps and head dim 96.
  lat gemma2 after gemma-2-9b 1 --max-model-len 4096
  lat phi3 after phi-3-mini-4k 1
fi
