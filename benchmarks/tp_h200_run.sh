#!/usr/bin/env bash
# Issue 15's GPU figures on 2 H200s (device kind nvidia-h200-x2), logs under $OUT:
#   PARTS="sweep tests tp2" bash benchmarks/tp_h200_run.sh      then   PARTS="tp1 nccl" ...
#   sweep   benchmarks/all_reduce_sweep.py: NCCL against the one-shot all-reduce per size
#   tests   tests/executor/test_tensor_parallel_gpu.py (float32 equality, graphs on and off)
#   prof1 / prof64   benchmarks/profile_step.py -tp 2 at batch 1 / 64
#   tp1 / tp2 / nccl / eager2   benchmarks/tp_bench.py: one GPU; two with the one-shot
#           all-reduce; two with NCCL only; two without CUDA graphs
# Needs the wheels of benchmarks/device_wheels.sh in .whl/ (carry it).
set -uo pipefail
OUT=${OUT:-tp-out}
mkdir -p "$OUT"
source benchmarks/device_env.sh
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
PARTS=${PARTS:-sweep tests tp2 tp1 nccl}
has() { [[ " $PARTS " == *" $1 "* ]]; }
M=benchmarks/llama-3.1-8b
LOG="$OUT/run.log"
nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1 | tee -a "$LOG"
nvidia-smi topo -m 2>&1 | head -5 | tee -a "$LOG"
env | grep ^NCCL_ | tee -a "$LOG"
has sweep && timeout 120 python3 benchmarks/all_reduce_sweep.py --json "$OUT/all_reduce.json" 2>&1 | tee "$OUT/sweep.log" | grep -v Warning | tee -a "$LOG"
# NCCL's protocol for the large (prefill) all-reduces: what it picks, against Simple.
has sweep_simple && NCCL_PROTO=Simple timeout 120 python3 benchmarks/all_reduce_sweep.py --json "$OUT/all_reduce_simple.json" 2>&1 | tee "$OUT/sweep_simple.log" | grep -v Warning | tee -a "$LOG"
has tests && timeout 240 python3 -m pytest -q -x tests/executor/test_tensor_parallel_gpu.py 2>&1 | tail -30 | tee -a "$LOG"
bench() {  # name, then tp_bench.py's flags
  local name=$1; shift
  timeout ${BENCH_TIMEOUT:-200} python3 benchmarks/tp_bench.py $M "$@" --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep RESULT "$OUT/$name.log")" | tee -a "$LOG"
  grep -E "memory profile|KV cache:|captured|engine ready|Error|error" "$OUT/$name.log" | head -12 | tee -a "$LOG"
}
has tp2 && bench tp2 -tp 2
has tp2simple && NCCL_PROTO=Simple bench tp2simple -tp 2 --cases tput
has tp1 && bench tp1 -tp 1
has nccl && bench nccl -tp 2 --disable-custom-all-reduce
# Where a TP=2 batch-1 / batch-64 decode step's time goes (rank 0's kernels and host phases).
for b in 1 64; do
  has prof$b && timeout 200 python3 benchmarks/profile_step.py $M -tp 2 --async-scheduling \
    --batch-size $b --output-len 64 --profile-steps 10 --json "$OUT/prof$b.json" > "$OUT/prof$b.log" 2>&1
  has prof$b && grep -v " INFO \|^ *[0-9]* ms " "$OUT/prof$b.log" | tail -45 | tee -a "$LOG"
done
has eager2 && bench eager2 -tp 2 --enforce-eager --cases b1,b64
exit 0
