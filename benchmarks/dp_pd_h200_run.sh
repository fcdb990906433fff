#!/usr/bin/env bash
# Issue 20 on 2 H200s (nvidia-h200-x2), Llama-3.1-8B's shape with dummy weights (the model
# folder .gpu-smoke/llama8b: its config.json and SmolLM2's tokenizer; build it and the
# wheels with benchmarks/device_wheels.sh, the workload with benchmarks/pd_mix_dataset.py
# build/pd_mix.jsonl; carry .whl, .gpu-smoke and build/pd_mix.jsonl). Logs under $OUT.
#   PARTS=dp   -dp 2, round-robin vs cache-aware, shared-prefix load under cache pressure
#              (32 system prompts of 2,048 tokens x 8 questions; 4,096 KV blocks a replica)
#   PARTS=pd   a mix of short chats (256 -> 128) and 5 % long prompts (8,000 -> 128) at a
#              fixed 8 requests/s: -dp 2 (co-located, least-load) vs 1 prefill GPU + 1
#              decode GPU (cadence router --prefill --decode), over KV_CONNECTOR
#              (default cuda_ipc; the decode engine also sees the prefill engine's GPU)
#   PARTS=tests  the connectors' tests on the GPU (in-process, and servers over each one)
#   PARTS=kv   benchmarks/kv_transfer_bench.py: an 8,000-token prompt's K/V moved by each
#              connector (load time, GB/s, time to first token against prefill alone)
# ONE_GPU=1: both replicas (or the prefill and the decode engine) share GPU 0, each with a
# fixed KV pool, behind `cadence router` (when only one H200 is lent).
set -uo pipefail
OUT=${OUT:-h200-out}
LOGS=${LOGS:-$OUT}  # the servers' and routers' logs (elsewhere: at most 8 files come back)
mkdir -p "$OUT" "$LOGS"
source benchmarks/device_env.sh
M=.gpu-smoke/llama8b
COMMON=(--load-format dummy --dtype bfloat16 --max-model-len 16384 ${SERVE_EXTRA:-})
CLI=(python3 -m cadence.cli.main)
PARTS=${PARTS:-dp pd}
KV_CONNECTOR=${KV_CONNECTOR:-cuda_ipc}
has() { [[ " $PARTS " == *" $1 "* ]]; }
wait_port() {  # wait_port PORT [PID]: until healthy, or the process is gone
  for _ in $(seq 900); do
    curl -sf "localhost:$1/health" >/dev/null && return 0
    [ -n "${2:-}" ] && ! kill -0 "$2" 2>/dev/null && break
    sleep 1
  done
  echo "nothing healthy on $1" >&2; return 1
}
bench() {  # bench NAME PORT workload...
  name=$1; port=$2; shift 2
  "${CLI[@]}" bench serve --base-url "http://127.0.0.1:$port" "$@" --ignore-eos \
    --save-result --result-dir "$OUT" --result-filename "$name.json" > "$OUT/$name.log" 2>&1
  python3 benchmarks/dp_hit_rate.py "http://127.0.0.1:$port" --json "$OUT/$name.hits.json" \
    >> "$OUT/$name.log" 2>&1
  python3 benchmarks/dp_summary.py "$OUT" "$name"
  # STEP_GAPS=1: each engine's step period (start the servers with SERVE_EXTRA=
  # "--step-timeline-size 100000")
  [ "${STEP_GAPS:-0}" = 1 ] && python3 benchmarks/step_gaps.py "http://127.0.0.1:$port" \
    2>&1 | tee -a "$OUT/$name.log"
}
stop_all() {  # and wait until the GPUs are free again (engine processes exit after them)
  kill -TERM "$@" 2>/dev/null; wait "$@" 2>/dev/null
  for _ in $(seq 60); do
    [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)" ] && return; sleep 1
  done
}
pkill -f "cadence.cli.main" 2>/dev/null; pkill -f "cadence::" 2>/dev/null; stop_all
ONE_GPU=${ONE_GPU:-0}
gpu() { [ "$ONE_GPU" = 1 ] && echo 0 || echo "$1"; }  # the GPU of replica $1
sees() { [ "$ONE_GPU" = 1 ] && echo 0 || echo "$1,$2"; }  # runs on GPU $1, sees $2 too
# Two processes on one GPU: each sizes its pool explicitly (the memory profile counts the
# other process's memory as used): 12,288 blocks = 196k tokens = 24 GiB, + 16 GiB of weights.
SHARE=(); [ "$ONE_GPU" = 1 ] && SHARE=(--num-gpu-blocks-override 12288)
start_dp() {  # start_dp NAME POLICY extra serve flags...: two replicas behind a router on 8500
  name=$1; policy=$2; shift 2
  if [ "$ONE_GPU" = 1 ]; then
    for i in 0 1; do
      CUDA_VISIBLE_DEVICES=0 "${CLI[@]}" serve $M "${COMMON[@]}" "${SHARE[@]}" "$@" \
        --port $((8511 + i)) > "$LOGS/$name.server$i.log" 2>&1 &
      PIDS+=($!)
      wait_port $((8511 + i)) $! || return 1  # one at a time: each profiles GPU memory
    done
    "${CLI[@]}" router --worker http://127.0.0.1:8511 --worker http://127.0.0.1:8512 \
      --policy "$policy" --port 8500 > "$LOGS/$name.router.log" 2>&1 &
    PIDS+=($!)
  else
    "${CLI[@]}" serve $M "${COMMON[@]}" "$@" -dp 2 --router-policy "$policy" --port 8500 \
      > "$LOGS/$name.server.log" 2>&1 &
    PIDS+=($!)
  fi
  wait_port 8500
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
if has tests; then
  python3 -m pytest -q -p no:cacheprovider tests/kv_transfer tests/cli/test_kv_transfer_flags.py \
    2>&1 | tee "$OUT/tests.log" | tail -3
  python3 -m pytest -q -p no:cacheprovider -rs tests/router/test_disaggregated.py -k cuda \
    2>&1 | tee -a "$OUT/tests.log" | tail -6
fi
if has kv; then
  PREFILL_GPUS=$(gpu 0) DECODE_GPUS=$(sees 1 0) python3 benchmarks/kv_transfer_bench.py \
    $M --prompt-len 8000 --reps 5 --out "$OUT/kv_transfer.json" -- "${COMMON[@]}" \
    --num-gpu-blocks-override 4096 2>&1 | tee "$OUT/kv_transfer.log" | tail -5
fi
if has dp; then
  SP=(--dataset-name shared-prefix --num-prompts 256 --prefix-repetition-num-prefixes 32
    --prefix-repetition-prefix-len 2048 --prefix-repetition-suffix-len 128
    --prefix-repetition-output-len 128 --max-concurrency 32 --seed 9)
  for policy in round-robin cache-aware; do
    PIDS=()
    start_dp "dp_$policy" $policy --num-gpu-blocks-override 4096 && bench "dp_$policy" 8500 "${SP[@]}"
    stop_all "${PIDS[@]}"
  done
fi
if has pd; then
  MIX=(--dataset-name jsonl --dataset-path build/pd_mix.jsonl --request-rate 8 --seed 1
    --num-prompts "${MIX_PROMPTS:-400}")
  PIDS=()
  start_dp mix_dp2 least-load && bench mix_dp2 8500 "${MIX[@]}"
  stop_all "${PIDS[@]}"
  CUDA_VISIBLE_DEVICES=$(gpu 0) "${CLI[@]}" serve $M "${COMMON[@]}" "${SHARE[@]}" \
    --kv-role prefill --kv-connector "$KV_CONNECTOR" --port 8501 \
    > "$LOGS/mix_pd_prefill.server.log" 2>&1 &
  p1=$!
  [ "$ONE_GPU" = 1 ] && wait_port 8501 $p1
  CUDA_VISIBLE_DEVICES=$(sees 1 0) "${CLI[@]}" serve $M "${COMMON[@]}" "${SHARE[@]}" \
    --kv-role decode --kv-connector "$KV_CONNECTOR" --port 8502 \
    > "$LOGS/mix_pd_decode.server.log" 2>&1 &
  p2=$!
  wait_port 8501 $p1 && wait_port 8502 $p2
  "${CLI[@]}" router --prefill http://127.0.0.1:8501 --decode http://127.0.0.1:8502 \
    --policy least-load --port 8500 > "$LOGS/mix_pd_router.log" 2>&1 &
  p3=$!
  wait_port 8500 && bench mix_pd 8500 "${MIX[@]}"
  curl -s localhost:8502/v1/engine/stats | python3 -c \
    "import json,sys; print('decode kv_transfer', json.load(sys.stdin)['kv_transfer'])" \
    | tee -a "$OUT/mix_pd.log"
  stop_all $p3 $p1 $p2
fi
