#!/usr/bin/env bash
# The step pacer (cadence/core/step_pacer.py, issue 37) on this machine: `cadence serve` of
# the default model with each --mixed-step-factor in FACTORS (0: off, the CPU default),
# alternated for ROUNDS rounds, each streamed by `cadence bench serve` at concurrency C with
# random prompts (IN tokens, +-50 %) -> OUT tokens, EOS ignored. One JSON per run in $OUT and
# a line each: ITL p50 / p99 against TPOT p50, TTFT p50 / p99, output tok/s, and the cap and
# decode step the engine view reports at the end.
#   OUT=pacer-cpu ROUNDS=2 FACTORS="0 2.5" C=16 bash benchmarks/step_pacer_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/step_pacer_cpu}
ROUNDS=${ROUNDS:-2}
FACTORS=${FACTORS:-0 2.5}
C=${C:-16}
N=${N:-64}
IN=${IN:-256}
OUTLEN=${OUTLEN:-128}
PY=${PY:-.venv/bin/python}
port=${PORT:-8777}
mkdir -p "$OUT"

for round in $(seq "$ROUNDS"); do
  for f in $FACTORS; do
    $PY -m cadence.cli.main serve --port "$port" --log-level warning --mixed-step-factor "$f" &
    server=$!
    for _ in $(seq 300); do curl -sf "localhost:$port/health" >/dev/null && break; sleep 1; done
    json="$OUT/factor${f}_round$round.json"
    $PY -m cadence.cli.main bench serve --port "$port" --max-concurrency "$C" --num-prompts "$N" \
      --random-input-len "$IN" --random-output-len "$OUTLEN" --random-range-ratio 0.5 \
      --ignore-eos --num-warmups 2 --seed "$round" --save-json "$json" > "$OUT/factor${f}_round$round.log" 2>&1
    stats=$(curl -sf "localhost:$port/v1/engine/stats")
    kill "$server"; wait "$server" || true
    $PY - "$json" "$f" "$round" "$stats" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s = s["runs"][0]["summary"]
sched = json.loads(sys.argv[4]).get("scheduler", {})
print(
    f"factor {sys.argv[2]} round {sys.argv[3]}: ITL p50 {s['median_itl_ms']:.1f} p99 "
    f"{s['p99_itl_ms']:.1f} ms (p99 / TPOT p50 {s['p99_itl_ms'] / s['median_tpot_ms']:.2f}), "
    f"TPOT p50 {s['median_tpot_ms']:.1f}, TTFT p50 {s['median_ttft_ms']:.0f} p99 "
    f"{s['p99_ttft_ms']:.0f} ms, {s['output_throughput']:.1f} out tok/s; cap "
    f"{sched.get('prefill_cap')}, decode step {sched.get('decode_step_ms')} ms"
)
PY
  done
done
