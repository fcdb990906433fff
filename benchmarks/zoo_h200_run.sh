#!/usr/bin/env bash
# Issue 31's GPU check, in one lease: the kernels' and the zoo's tests on CUDA, Llama-3.1-8B
# before and after a kernel change (.gpu-before/cadence: the tree before it, from
# `git archive`), then the zoo's shapes with dummy weights:
#   rm -rf .gpu-before && mkdir .gpu-before && git archive f3e1606 cadence | tar -x -C .gpu-before
#   PARTS=tests bash benchmarks/zoo_h200_run.sh     (carry .whl and .gpu-before)
#   PARTS=zoo bash benchmarks/zoo_h200_run.sh ; PARTS="lat long" bash benchmarks/zoo_h200_run.sh
# Results under $OUT (or ./zoo-out): one JSON per case (`cadence bench latency`), zoo.log.
set -uo pipefail
OUT=${OUT:-zoo-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
source benchmarks/device_env.sh
ROOT=$PWD
COMMON="--load-format dummy --dtype bfloat16"
PARTS=${PARTS:-tests zoo gemma cap gcap lat long}
has() { [[ " $PARTS " == *" $1 "* ]]; }
LOG="$OUT/zoo.log"
tree() {
  local name=$1; shift
  local dir=$ROOT; [ "$name" = before ] && dir=$ROOT/.gpu-before
  (cd "$dir" && PYTHONPATH=/tmp/site:$dir "$@")
}
lat() {  # lat NAME TREE MODEL BATCH INPUT [flags]: one `bench latency` at INPUT -> 256
  local name=$1 which=$2 model=$3 b=$4 in=$5; shift 5
  local t0=$SECONDS
  echo "== $name b$b in$in $which" | tee -a "$LOG"
  tree "$which" python3 -m cadence.cli.main bench latency "$ROOT/benchmarks/$model" $COMMON \
    --batch-size "$b" --input-len "$in" --output-len 256 --num-iters 2 "$@" \
    --json "$OUT/${name}_b${b}_in${in}_$which.json" 2>&1 | tee "$OUT/${name}_b${b}_in${in}_$which.log" \
    | grep -v " INFO \|it/s\]" | tail -3 | tee -a "$LOG"
  echo "   ($((SECONDS - t0)) s)" | tee -a "$LOG"
}
if has tests; then
  python3 -m pytest -q -m gpu tests/attention tests/worker/test_cuda_runner.py tests/ops/test_fused.py \
    tests/spec_decode/test_spec_gpu.py -p no:cacheprovider 2>&1 | tee -a "$OUT/tests.log" | tail -4
fi
if has gemma; then  # the fused Gemma norm and GeGLU kernels: their tests, then Gemma 2 again
  python3 -m pytest -q -m gpu tests/ops/test_fused.py tests/worker/test_cuda_runner.py -k \
    "fused or gemma" -p no:cacheprovider 2>&1 | tee -a "$OUT/tests.log" | tail -3
  for b in 1 64; do lat gemma2 after gemma-2-9b "$b" 128; done
fi
if has cap; then  # Mistral-7B's KV capacity at 32k with window-released blocks
  python3 benchmarks/window_capacity.py benchmarks/mistral-7b-v0.1 --load-format dummy \
    --dtype bfloat16 --context 32000 --requests 40 --json "$OUT/mistral_capacity.json" 2>&1 \
    | grep -v " INFO " | tail -18 | tee -a "$LOG"
fi
if has gcap; then  # Gemma-2-9B's KV capacity near its 8,192 positions, with KV groups
  python3 benchmarks/window_capacity.py benchmarks/gemma-2-9b --load-format dummy \
    --dtype bfloat16 --context 7900 --requests 64 --json "$OUT/gemma2_capacity.json" 2>&1 \
    | grep -v " INFO " | tail -18 | tee -a "$LOG"
fi
if has zoo; then
  # Each at its config's own context (Mistral 32,768: its 4,096 window slides).
  for b in 1 64; do
    lat gemma2 after gemma-2-9b "$b" 128
    lat phi3 after phi-3-mini-4k "$b" 128
    lat mistral after mistral-7b-v0.1 "$b" 128
    lat qwen2.5 after qwen2.5-7b "$b" 128
  done
  lat mistral after mistral-7b-v0.1 1 8000
  lat qwen2.5 after qwen2.5-7b 1 8000
fi
if has lat; then
  for which in before after before after; do lat llama "$which" llama-3.1-8b 1 128; done
  for which in before after; do lat llama "$which" llama-3.1-8b 64 128; done
fi
if has long; then
  for which in before after; do lat llama "$which" llama-3.1-8b 1 8000; done
fi
