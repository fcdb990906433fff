#!/usr/bin/env bash
# Issue 20, disaggregated prefill/decode on this 2-core CPU (benchmarks/RESULTS.md): SmolLM2
# (GGUF), a mix of short prompts (128 -> 64) and 5 % long ones (2,000 -> 64) at a fixed
# request rate, EOS ignored:
#   -dp 2 (co-located: each replica prefills and decodes, least-load, one core each)
#   vs prefill engine (core 0) + decode engine (core 1) behind `cadence router`.
#   bash benchmarks/pd_cpu.sh [OUT_DIR]      (default benchmarks/results/pd_cpu)
set -uo pipefail
OUT=$(realpath -m "${1:-benchmarks/results/pd_cpu}")
mkdir -p "$OUT"
source benchmarks/serve_lib.sh
PY=.venv/bin/python
DATA=build/pd_mix_cpu.jsonl
mkdir -p build
$PY benchmarks/pd_mix_dataset.py $DATA --num 90 --long-len 2000 --short-len 128 --output-len 64
MIX=(--dataset-name jsonl --dataset-path $DATA --request-rate ${RATE:-1.5} --seed 1 --ignore-eos)
bench() {  # bench NAME
  $PY -m cadence.cli.main bench serve --base-url http://127.0.0.1:8420 "${MIX[@]}" \
    --save-result --result-dir "$OUT" --result-filename "$1.json" > "$OUT/$1.log" 2>&1
  $PY benchmarks/dp_summary.py "$OUT" "$1" | tee -a "$OUT/summary.txt"
}
$PY -m cadence.cli.main serve -dp 2 --router-policy least-load --port 8420 \
  > "$OUT/dp2.server.log" 2>&1 &
pid=$!
wait_healthy 8420 && bench mix_dp2
kill -TERM $pid; wait $pid
taskset -c 0 $PY -m cadence.cli.main serve --kv-role prefill --port 8421 > "$OUT/pd_prefill.server.log" 2>&1 &
p1=$!
taskset -c 1 $PY -m cadence.cli.main serve --kv-role decode --port 8422 > "$OUT/pd_decode.server.log" 2>&1 &
p2=$!
wait_healthy 8421 && wait_healthy 8422
$PY -m cadence.cli.main router --prefill http://127.0.0.1:8421 --decode http://127.0.0.1:8422 \
  --policy least-load --port 8420 > "$OUT/pd_router.log" 2>&1 &
p3=$!
wait_healthy 8420 && bench mix_pd
kill -TERM $p3 $p1 $p2; wait $p3 $p1 $p2
