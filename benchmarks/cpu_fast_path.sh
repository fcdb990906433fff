#!/usr/bin/env bash
# Issue 18's figures, one sitting on this machine: SmolLM2-135M-Instruct served on the CPU,
# streamed /v1/completions, random 128 -> 128, EOS ignored, 32 prompts a point, concurrency
# 1, 4, 16, every server measured by the same client (`cadence bench serve`):
#   bash benchmarks/cpu_fast_path.sh [OUT_DIR]
# Servers, one at a time (CONFIGS="name ..." picks some):
#   cadence        the defaults: GGUF blocks kept packed, fused CPU kernels, paged
#                  attention, threads pinned, 512-token budget
#   cadence-bf16   the same with the file expanded to bf16 (--quantization none)
#   nobind         defaults but --no-cpu-bind-threads (what pinning buys)
#   budget2048     defaults but --max-num-batched-tokens 2048 (what the budget buys)
#   before         bf16, CADENCE_CPU_KERNELS=0, unpinned, 2048 budget: the path before
#                  this issue (torch ops, torch attention backend)
#   vllm           vLLM's CPU build (VLLM_DIR: a folder with start_vllm.sh, see
#                  benchmarks/README.md), bound to both cores
# Then offline `cadence bench throughput` against transformers' generate (bf16, 64 x 128
# -> 128, greedy), unless SKIP_OFFLINE=1.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results/cpu_fast_path}
mkdir -p "$out"
out=$(cd "$out" && pwd)  # absolute: the vLLM server starts from its own folder
bin=.venv/bin/cadence
port=8766
vllm_dir=${VLLM_DIR:-/work/vllm-cmp}
configs=${CONFIGS:-"cadence cadence-bf16 nobind budget2048 before vllm"}

source benchmarks/serve_lib.sh  # wait_healthy

for name in $configs; do
  p=$port env=() flags=()
  case $name in
    cadence) ;;
    cadence-bf16) flags=(--quantization none --dtype bfloat16) ;;
    nobind) flags=(--no-cpu-bind-threads) ;;
    budget2048) flags=(--max-num-batched-tokens 2048) ;;
    before) env=(CADENCE_CPU_KERNELS=0)
            flags=(--quantization none --dtype bfloat16 --no-cpu-bind-threads
                   --max-num-batched-tokens 2048) ;;
    vllm) p=8200 ;;
    *) echo "unknown config $name" >&2; exit 2 ;;
  esac
  t0=$(date +%s.%N)
  if [ "$name" = vllm ]; then
    log=$out/server_vllm.log
    (cd "$vllm_dir" && exec setsid ./start_vllm.sh > "$log" 2>&1) &
  else
    env "${env[@]}" $bin serve --port $p --log-level warning "${flags[@]}" \
      > "$out/server_$name.log" 2>&1 &
  fi
  server=$!
  wait_healthy $p
  echo "$name: healthy after $(echo "$(date +%s.%N) - $t0" | bc) s" | tee "$out/startup_$name.txt"
  $bin bench serve --port $p --sweep 1,4,16 --num-prompts 32 --random-input-len 128 \
    --random-output-len 128 --ignore-eos --server-pid $server --rss-interval 2 \
    --save-json "$out/serve_$name.json" 2>&1 | grep -v " INFO " | tee "$out/serve_$name.log" \
    | sed -n '/^Sweep/,$p'
  if [ "$name" = vllm ]; then kill -TERM -- -$server 2>/dev/null || true; fi
  kill $server 2>/dev/null || true
  wait $server 2>/dev/null || true
  sleep 2
done

if [ -z "${SKIP_OFFLINE:-}" ]; then
  $bin bench throughput --num-prompts 64 --input-len 128 --output-len 128 --dtype bfloat16 \
    --quantization none --log-level warning --json "$out/offline_cadence_bf16.json" \
    | tee "$out/offline_cadence_bf16.log"
  $bin bench throughput --num-prompts 64 --input-len 128 --output-len 128 --log-level warning \
    --json "$out/offline_cadence_gguf.json" | tee "$out/offline_cadence_gguf.log"
  .venv/bin/python benchmarks/hf_baseline.py --num-prompts 64 --input-len 128 --output-len 128 \
    --dtype bfloat16 | tee "$out/offline_transformers_bf16.log"
fi
