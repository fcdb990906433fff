#!/usr/bin/env bash
# Issue 37 on the H200: the serving path against the offline harness, Llama-3.1-8B's shape
# with dummy bf16 weights (.gpu-smoke/llama8b: its config.json and SmolLM2's tokenizer; build
# it and the wheels with benchmarks/device_wheels.sh, carry .whl and .gpu-smoke).
#   PARTS=offline  `cadence bench throughput`, 128 -> 256, EOS ignored, --max-num-seqs C and
#                  2 x C prompts (at least 8), for each C in CONC
#   PARTS=served   benchmarks/api_cpu.py: `cadence serve` with --api-server-count each of
#                  COUNTS (and the default), `cadence bench serve` streaming the same load at
#                  each C: output tok/s, TTFT, TPOT, ITL, the API processes' CPU per token
#   PARTS=router   one replica with and without `cadence router` in front (C=64): the
#                  relay's added TTFT and ITL
# Results (JSON) and logs under $OUT.
set -uo pipefail
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
source benchmarks/device_env.sh
M=.gpu-smoke/llama8b
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
  python3 benchmarks/api_cpu.py --model $M --serve-args "$COMMON --log-level warning" \
    --api-server-count "$COUNTS" --concurrency "$CONC" --json "$OUT/served.json" \
    2>&1 | tee "$OUT/served.log"
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
      python3 - "$OUT/router_${where%%:*}_$round.json" "${where%%:*} round $round" <<'PY' | tee -a "$OUT/router.txt"
import json, sys
s = json.load(open(sys.argv[1]))["runs"][0]["summary"]
print(f"{sys.argv[2]}: {s['output_throughput']:.0f} tok/s, TTFT p50 {s['median_ttft_ms']:.1f} ms, "
      f"ITL p50 {s['median_itl_ms']:.2f} p99 {s['p99_itl_ms']:.2f} ms, TPOT p50 {s['median_tpot_ms']:.2f} ms")
PY
    done
  done
  kill -TERM $rt $rep; wait $rt $rep 2>/dev/null
fi
