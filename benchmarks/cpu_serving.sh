#!/usr/bin/env bash
# CPU serving figures (issues 3, 5, 7): SmolLM2-135M-Instruct, bf16, this machine's cores.
#   bash benchmarks/cpu_serving.sh [OUT_DIR]
# 1. `cadence serve` + `cadence bench serve --sweep 1,4,16`, random 128 -> 128, ignore EOS
# 2. the offline engine on the same prompts at the same concurrency (max_num_seqs = C)
# 3. the shared-prefix workload (8 system prompts x 1000 tokens, 16 questions each, shuffled)
#    at concurrency 16: no cache, hash + fcfs, radix + fcfs, radix + lpm
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results}
mkdir -p "$out"
port=8765
bin=.venv/bin/cadence
label=${LABEL:-cpu-$(date +%F)}

serve() {  # serve ARGS... : start a server, wait until healthy
  $bin serve --port $port --log-level warning "$@" &
  server=$!
  for _ in $(seq 300); do curl -sf localhost:$port/health >/dev/null && return; sleep 1; done
  echo "server did not start" >&2; exit 1
}
stop() { kill $server; wait $server || true; }

if [ -z "${SKIP_SWEEP:-}" ]; then
  serve
  $bin bench serve --port $port --sweep 1,4,16 --num-prompts 32 --random-input-len 128 \
    --random-output-len 128 --ignore-eos --save-json "$out/serve_sweep.json" \
    --scoreboard benchmarks/SCOREBOARD.md --label "$label serve" --plot "$out/serve_sweep.png"
  stop
  for c in 1 4 16; do
    $bin bench throughput --num-prompts 32 --input-len 128 --output-len 128 --max-num-seqs $c \
      --log-level warning --json "$out/offline_c$c.json"
  done
fi

if [ -z "${SKIP_PREFIX:-}" ]; then
  for cfg in "none:--no-enable-prefix-caching" "hash-fcfs:--prefix-cache hash" \
             "radix-fcfs:--prefix-cache radix" "radix-lpm:--prefix-cache radix --scheduling-policy lpm"; do
    name=${cfg%%:*}; flags=${cfg#*:}
    # shellcheck disable=SC2086
    serve $flags
    $bin bench serve --port $port --dataset-name shared-prefix --prefix-repetition-num-prefixes 8 \
      --prefix-repetition-prefix-len 1000 --prefix-repetition-suffix-len 64 \
      --prefix-repetition-output-len 128 --num-prompts 128 --max-concurrency 16 --ignore-eos \
      --save-json "$out/prefix_$name.json" --scoreboard benchmarks/SCOREBOARD.md --label "$label prefix $name"
    curl -s localhost:$port/metrics | grep -E '^cadence:prefix_cache_(queries|hits)_total' > "$out/prefix_$name.metrics"
    stop
  done
fi
