#!/usr/bin/env bash
# Issue 30's GPU check, in one lease: the GPU tests on this tree, then the same benchmark
# cases on the tree before the refactor (.gpu-before/cadence, from `git archive`) and on
# this one, alternating, so both see the same machine:
#   rm -rf .gpu-before && mkdir .gpu-before && git archive 7e409a4 cadence | tar -x -C .gpu-before
#   PARTS=tests bash benchmarks/seams_h200_run.sh      (carry .whl and .gpu-before)
#   PARTS=lat bash benchmarks/seams_h200_run.sh ; PARTS=long bash benchmarks/seams_h200_run.sh
# lat: `cadence bench latency` at batch 1 and 64 (128 -> 256, bf16, dummy Llama-3.1-8B);
# long: benchmarks/long_context.py's cases. Results under $OUT (or ./seams-out).
set -uo pipefail
OUT=${OUT:-seams-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
source benchmarks/device_env.sh
ROOT=$PWD
M=$ROOT/benchmarks/llama-3.1-8b
COMMON="--load-format dummy --dtype bfloat16"
PARTS=${PARTS:-tests lat long}
has() { [[ " $PARTS " == *" $1 "* ]]; }
LOG="$OUT/seams.log"
# tree NAME: run the rest of the line with that tree's cadence first on the path (from its
# own folder, so `python -m` finds it and not this checkout's).
tree() {
  local name=$1; shift
  local dir=$ROOT; [ "$name" = before ] && dir=$ROOT/.gpu-before
  (cd "$dir" && PYTHONPATH=/tmp/site:$dir "$@")
}
if has tests; then
  for t in tests/worker/test_cuda_runner.py tests/ops/test_fused.py \
           tests/attention/test_triton_paged.py tests/spec_decode/test_spec_gpu.py; do
    python3 -m pytest -q -m gpu "$t" -p no:cacheprovider -x 2>&1 | tee -a "$OUT/tests.log" | tail -2
  done
  python3 -m pytest -q tests/engine tests/worker/test_model_runner.py tests/core \
    -p no:cacheprovider 2>&1 | tee -a "$OUT/tests.log" | tail -4
fi
if has lat; then
  for b in 1 64; do
    for name in before after before after; do
      echo "== lat_b$b $name" | tee -a "$LOG"
      tree $name python3 -m cadence.cli.main bench latency "$M" $COMMON --batch-size $b \
        --input-len 128 --output-len 256 --num-iters 3 --json "$OUT/lat_b${b}_$name.json" \
        2>&1 | grep -v " INFO \|it/s\]" | tail -4 | tee -a "$LOG"
    done
  done
fi
if has long; then
  for name in before after; do
    echo "== long $name" | tee -a "$LOG"
    tree $name python3 "$ROOT/benchmarks/long_context.py" "$M" ${CASES:+--cases $CASES} \
      --json "$OUT/long_$name.json" 2>&1 | grep -v " INFO " | tee -a "$LOG" | tail -12
  done
fi
