#!/usr/bin/env bash
# Issue 20 on this CPU (benchmarks/RESULTS.md, "Data parallel and disaggregated"): SmolLM2
# (GGUF), the shared-prefix workload (8 system prompts x 16 questions), 16 at once:
#   one engine (both cores)  vs  -dp 2 round-robin  vs  -dp 2 cache-aware  (one core each);
# throughput from `cadence bench serve`, hit rate from the replicas' own /metrics.
# PARTS=pressure: the same under cache pressure: 16 system prompts of 1,024 tokens x 8
# questions, 256 MiB of KV per replica (512 MiB for the one engine): the prefixes fit in
# one replica's cache only if the router splits them.
#   [PARTS="issue pressure"] bash benchmarks/dp_cpu.sh [OUT_DIR]   (default benchmarks/results/dp_cpu)
set -uo pipefail
OUT=$(realpath -m "${1:-benchmarks/results/dp_cpu}")
mkdir -p "$OUT"
source benchmarks/serve_lib.sh
PY=.venv/bin/python
PORT=8411
WORKLOAD=(--dataset-name shared-prefix --num-prompts 128 --prefix-repetition-num-prefixes 8
  --prefix-repetition-prefix-len 512 --prefix-repetition-suffix-len 64
  --prefix-repetition-output-len 64 --max-concurrency 16 --seed 7)
run() {  # run NAME serve-flags...
  name=$1; shift
  $PY -m cadence.cli.main serve --port $PORT "$@" > "$OUT/$name.server.log" 2>&1 &
  pid=$!
  wait_healthy $PORT || { kill $pid; return 1; }
  $PY -m cadence.cli.main bench serve --base-url http://127.0.0.1:$PORT "${WORKLOAD[@]}" \
    --save-result --result-dir "$OUT" --result-filename "$name.json" 2>&1 | tee "$OUT/$name.log" | tail -14
  $PY benchmarks/dp_hit_rate.py http://127.0.0.1:$PORT --json "$OUT/$name.hits.json" | tee -a "$OUT/$name.log"
  kill -TERM $pid; wait $pid
}
PARTS=${PARTS:-issue pressure}
if [[ " $PARTS " == *" issue "* ]]; then
  run one_engine
  run dp2_round_robin -dp 2 --router-policy round-robin
  run dp2_cache_aware -dp 2 --router-policy cache-aware
  $PY benchmarks/dp_summary.py "$OUT" one_engine dp2_round_robin dp2_cache_aware | tee "$OUT/summary.txt"
fi
if [[ " $PARTS " == *" pressure "* ]]; then
  WORKLOAD=(--dataset-name shared-prefix --num-prompts 128 --prefix-repetition-num-prefixes 16
    --prefix-repetition-prefix-len 1024 --prefix-repetition-suffix-len 64
    --prefix-repetition-output-len 32 --max-concurrency 16 --seed 8)
  run p_one_engine --kv-cache-memory 512MiB
  run p_dp2_round_robin -dp 2 --router-policy round-robin --kv-cache-memory 256MiB
  run p_dp2_cache_aware -dp 2 --router-policy cache-aware --kv-cache-memory 256MiB
  $PY benchmarks/dp_summary.py "$OUT" p_one_engine p_dp2_round_robin p_dp2_cache_aware \
    | tee "$OUT/summary_pressure.txt"
fi
