#!/usr/bin/env bash
# Issue 16's GPU figures on one H200 (benchmarks/spec_decode_gpu.py), logs under $OUT:
#   PARTS="tests verify plain" bash benchmarks/spec_h200_run.sh   then   PARTS="draft1b same" ...
#   tests    tests/spec_decode/test_spec_gpu.py (float32 equality, graphs, every proposer)
#   verify   verify steps of 1..9 tokens a sequence at batch 1, 8, 64 (Llama-3.1-8B shape)
#   plain    the same engine without speculation: the decode step the ratios divide by
#   draft1b  a Llama-3.2-1B-shaped draft model, k = 4: its time per step, tok/s
#   same     an identical draft (the target's config and seed), k = 4: the ceiling check
#   eagle    an EAGLE-3 head of the public Llama-3.1-8B head's shape (dummy weights), k = 4
# Needs the wheels of benchmarks/device_wheels.sh in .whl/ (carry it).
set -uo pipefail
OUT=${OUT:-spec-out}
mkdir -p "$OUT"
source benchmarks/device_env.sh
PARTS=${PARTS:-tests verify plain draft1b same}
has() { [[ " $PARTS " == *" $1 "* ]]; }
M=benchmarks/llama-3.1-8b
LOG="$OUT/run.log"
nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1 | tee -a "$LOG"
has tests && timeout 240 python3 -m pytest -q -x tests/spec_decode/test_spec_gpu.py 2>&1 | tail -30 | tee -a "$LOG"
bench() {  # name, then spec_decode_gpu.py's arguments
  local name=$1; shift
  timeout ${BENCH_TIMEOUT:-240} python3 benchmarks/spec_decode_gpu.py "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$?" | tee -a "$LOG"
  grep -E '^\{|Error|error|captured|engine ready' "$OUT/$name.log" | head -40 | tee -a "$LOG"
}
has verify && bench verify verify $M
has plain && bench plain plain $M
has draft1b && bench draft1b draft $M --draft benchmarks/llama-3.2-1b
has same && bench same draft $M --draft $M
has eagle && bench eagle draft $M --method eagle3 --draft benchmarks/eagle3-llama-3.1-8b
exit 0
