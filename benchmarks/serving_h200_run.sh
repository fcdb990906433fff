#!/usr/bin/env bash
# Issue 37 on the H200: the serving path against the offline harness, Llama-3.1-8B's shape
# with dummy bf16 weights (.gpu-smoke/llama8b-v49k: its config.json, the vocabulary cut to
# SmolLM2's tokenizer, which it carries; build it and the wheels with
# benchmarks/device_wheels.sh, carry .whl and .gpu-smoke; M= picks another model folder).
#   PARTS=offline  `cadence bench throughput`, 128 -> 256, EOS ignored, --max-num-seqs C and
#                  2 x C prompts (at least 8), for each C in CONC
#   PARTS=served   benchmarks/api_cpu.py: `cadence serve` with --api-server-count each of
#                  COUNTS (and the default), `cadence bench serve` streaming the same load at
#                  each C: output tok/s, TTFT, TPOT, ITL, the API processes' CPU per token
#   PARTS=router   one replica with and without `cadence router` in front (C=64): the
#                  relay's added TTFT and ITL
#   PARTS=dp1gpu   two replicas sharing the GPU behind `cadence router` (C=64 through it)
#                  against the same two driven directly (C=32 each, at once)
#   PARTS=cap      for each --max-prefill-tokens-while-decoding in CAPS: served at C=256
#                  (2 API processes) with the engine's step times, and offline at C=256
#                  and 256 x 1,024 -> 256 (the bound's cost where prefill dominates; CAP_LONG=0
#                  skips it)
#   PARTS=defaults `cadence serve`'s GPU defaults (prompt tokens beside decodes bounded, mixed
#                  steps in graphs) at C=1 and 256 with the engine's step times, the settings
#                  before them at 256, and --max-num-seqs 512 at C=512; offline at C=256 and
#                  512 beside them (served / offline, ITL p99 against TPOT p50)
#   PARTS=pacer    for each --mixed-step-factor in FACTORS (0: the static bound alone;
#                  default: the flag left out):
#                  served at C=256 (2 API processes) with the engine's step times
#   PARTS=burst    benchmarks/api_burst.py against `cadence serve` (2 API processes): 256
#                  streams, then 256 requests at once, with the intake gate off
#                  (CADENCE_INTAKE_LIMIT=0) and at its default: the streams' gaps against
#                  the engine's steps while the burst is taken
# Results (JSON) and logs under $OUT.
set -uo pipefail
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
source benchmarks/device_env.sh
M=${M:-.gpu-smoke/llama8b-v49k}  # (llama8b: the 128,256-token vocabulary, see device_wheels.sh)
COMMON="--load-format dummy --dtype bfloat16"
CLI=(python3 -m cadence.cli.main)
PARTS=${PARTS:-offline served}
CONC=${CONC:-1,64,256,512}
COUNTS=${COUNTS:-1,2,4}
has() { [[ " $PARTS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
nproc | tee -a "$OUT/gpu.txt"

if has offline; then
  for c in ${CONC//,/ }; do
    n=$(( 2 * c < 8 ? 8 : 2 * c ))
    "${CLI[@]}" bench throughput --model $M $COMMON --num-prompts $n --input-len 128 \
      --output-len 256 --max-num-seqs $c --json "$OUT/offline_c$c.json" --log-level warning \
      2>&1 | grep -E "Throughput" | sed "s/^/offline c=$c: /" | tee -a "$OUT/offline.log"
  done
fi

if has served; then
  python3 benchmarks/api_cpu.py --model $M --serve-args "$COMMON --log-level warning \
    --step-timeline-size 4096" \
    --api-server-count "$COUNTS" --concurrency "$CONC" --steps --json "$OUT/served.json" \
    2>&1 | tee "$OUT/served.log"
fi

if has defaults; then
  served() {  # LABEL CONC SERVE-ARGS: a server of 2 API processes, one JSON row per C
    timeout 300 python3 benchmarks/api_cpu.py --model $M --api-server-count 2 --concurrency "$2" \
      --steps --serve-args "$COMMON --log-level warning --step-timeline-size 8192 $3" 2>&1 \
      | grep '^{' | sed "s/^/$1 /" | tee -a "$OUT/defaults_served.log"
  }
  served defaults 1,256 ""
  served before 256 "--max-prefill-tokens-while-decoding 0 --no-cuda-graph-prefill"
  served defaults-seqs512 512 "--max-num-seqs 512"
  for c in 256 512; do
    "${CLI[@]}" bench throughput --model $M $COMMON --num-prompts $(( 2 * c )) --input-len 128 \
      --output-len 256 --max-num-seqs $c --log-level warning 2>&1 | grep -E "Throughput" \
      | sed "s/^/offline c=$c: /" | tee -a "$OUT/defaults_offline.log"
  done
fi

if has burst; then
  for limit in 0 8; do
    CADENCE_INTAKE_LIMIT=$limit "${CLI[@]}" serve $M $COMMON --port 8620 --api-server-count 2 \
      --log-level warning > "$OUT/burst_server_$limit.log" 2>&1 &
    srv=$!
    for _ in $(seq 600); do curl -sf localhost:8620/health >/dev/null && break; sleep 1; done
    python3 benchmarks/api_burst.py --base-url http://127.0.0.1:8620 --streams 256 \
      --burst 256 --rounds 4 | sed "s/^/limit=$limit /" | tee -a "$OUT/burst.log"
    kill -TERM $srv; wait $srv
  done
fi

bench_line() {  # FILE LABEL: one line of a `bench serve --save-json` summary
  python3 - "$1" "$2" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["runs"][0]["summary"]
print(f"{sys.argv[2]}: {s['output_throughput']:.0f} tok/s, TTFT p50 {s['median_ttft_ms']:.1f} ms, "
      f"ITL p50 {s['median_itl_ms']:.2f} p99 {s['p99_itl_ms']:.2f} ms, TPOT p50 {s['median_tpot_ms']:.2f} ms")
PY
}

if has cap; then
  CAPS=${CAPS:-0,2048,1024,512}
  for cap in ${CAPS//,/ }; do
    timeout 240 python3 benchmarks/api_cpu.py --model $M --api-server-count 2 --concurrency 256 \
      --steps --serve-args "$COMMON --log-level warning --step-timeline-size 4096 \
      --max-prefill-tokens-while-decoding $cap" 2>&1 | grep '^{' | sed "s/^/cap=$cap /" \
      | tee -a "$OUT/cap_served.log"
    "${CLI[@]}" bench throughput --model $M $COMMON --num-prompts 512 --input-len 128 \
      --output-len 256 --max-num-seqs 256 --max-prefill-tokens-while-decoding $cap \
      --log-level warning 2>&1 | grep -E "Throughput" | sed "s/^/offline c=256 cap=$cap: /" \
      | tee -a "$OUT/cap_offline.log"
    [ "${CAP_LONG:-1}" = 1 ] && "${CLI[@]}" bench throughput --model $M $COMMON --num-prompts 256 --input-len 1024 \
      --output-len 256 --max-prefill-tokens-while-decoding $cap --log-level warning 2>&1 \
      | grep -E "Throughput" | sed "s/^/offline 256x1024 cap=$cap: /" | tee -a "$OUT/cap_offline.log"
  done
fi

if has pacer; then
  FACTORS=${FACTORS:-0,2,2.5,3}
  for f in ${FACTORS//,/ }; do  # "default": the flag left out (the served default)
    flag="--mixed-step-factor $f"; [ "$f" = default ] && flag=""
    timeout 240 python3 benchmarks/api_cpu.py --model $M --api-server-count 2 --concurrency 256 \
      --steps --serve-args "$COMMON --log-level warning --step-timeline-size 4096 $flag" 2>&1 \
      | grep '^{' | sed "s/^/factor=$f /" | tee -a "$OUT/pacer_served.log"
  done
fi

if has dp1gpu; then
  # The pool's share counts every process's use of the GPU: the second replica's 0.85 of
  # the device leaves it what the first (0.42) did not take.
  util=0.42
  for port in 8611 8612; do
    "${CLI[@]}" serve $M $COMMON --port $port --gpu-memory-utilization $util \
      --log-level warning > "$OUT/replica_$port.log" 2>&1 &
    for _ in $(seq 600); do curl -sf localhost:$port/health >/dev/null && break; sleep 1; done
    util=0.85
  done
  "${CLI[@]}" router --worker http://127.0.0.1:8611 --worker http://127.0.0.1:8612 --port 8610 \
    > "$OUT/router_dp.log" 2>&1 &
  for _ in $(seq 120); do curl -sf localhost:8610/health >/dev/null && break; sleep 1; done
  B=("${CLI[@]}" bench serve --dataset-name random --random-input-len 128
     --random-output-len 256 --ignore-eos)
  for round in 1 2; do
    "${B[@]}" --base-url http://127.0.0.1:8610 --max-concurrency 64 --num-prompts 256 \
      --save-json "$OUT/dp_router.json" > /dev/null 2>&1
    bench_line "$OUT/dp_router.json" "router, C=64, round $round" | tee -a "$OUT/dp1gpu.txt"
    clients=()
    for port in 8611 8612; do
      "${B[@]}" --base-url http://127.0.0.1:$port --max-concurrency 32 --num-prompts 128 \
        --save-json "$OUT/dp_direct_$port.json" > /dev/null 2>&1 &
      clients+=($!)
    done
    wait "${clients[@]}"
    for port in 8611 8612; do
      bench_line "$OUT/dp_direct_$port.json" "direct :$port, C=32, round $round" \
        | tee -a "$OUT/dp1gpu.txt"
    done
  done
  rm -f "$OUT"/dp_*.json
  pkill -TERM -f "cadence.cli.main (router|serve)"; sleep 5
fi

if has router; then
  "${CLI[@]}" serve $M $COMMON --port 8601 --log-level warning > "$OUT/replica.log" 2>&1 &
  rep=$!
  for _ in $(seq 600); do curl -sf localhost:8601/health >/dev/null && break; sleep 1; done
  "${CLI[@]}" router --worker http://127.0.0.1:8601 --port 8600 > "$OUT/router.log" 2>&1 &
  rt=$!
  for _ in $(seq 120); do curl -sf localhost:8600/health >/dev/null && break; sleep 1; done
  for round in 1 2; do
    for where in direct:8601 router:8600; do
      "${CLI[@]}" bench serve --base-url "http://127.0.0.1:${where#*:}" --dataset-name random \
        --random-input-len 128 --random-output-len 256 --max-concurrency 64 --num-prompts 256 \
        --ignore-eos --save-json "$OUT/router_${where%%:*}_$round.json" > /dev/null 2>&1
      bench_line "$OUT/router_${where%%:*}_$round.json" "${where%%:*} round $round" \
        | tee -a "$OUT/router.txt"
    done
  done
  kill -TERM $rt $rep; wait $rt $rep 2>/dev/null
fi
