#!/usr/bin/env bash
# Issues 18 and 38's cross-check: vLLM's own client (`vllm bench serve`) against
# `cadence serve` and vLLM's CPU build, one sitting, concurrency 1, 4, 16, random 128 -> 128,
# EOS ignored, 16 prompts a point (2 x the concurrency past 8):
#   bash benchmarks/cpu_vllm_client.sh [OUT_DIR]
# CONCURRENCY="1 4 16 32", NUM_PROMPTS=32 (every point) and ORDER="vllm cadence" change the
# sweep; CADENCE_ARGS="--max-num-batched-tokens 2048" adds flags to the Cadence servers. The servers ORDER may name:
#   cadence        `cadence serve` as `make serve` runs it (the GGUF file, Q4_1/Q8_0 packed)
#   cadence-bf16   the same file expanded to bf16 (--quantization none --dtype bfloat16)
#   vllm           vLLM's CPU build on a bf16 copy of the same weights
#   llamacpp       llama-cpp-python's server on the same GGUF file (LLAMACPP_PY: its venv's
#                  python, default /work/llamacpp-venv/bin/python; both cores)
# Needs benchmarks/vllm_cpu/setup.sh's folder (VLLM_DIR, default /work/vllm-cmp): its client.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results/cpu_fast_path}
mkdir -p "$out"
out=$(cd "$out" && pwd)  # absolute: the vLLM server starts from its own folder
vllm_dir=${VLLM_DIR:-/work/vllm-cmp}
client=("$vllm_dir/venv/bin/python" "$vllm_dir/vllm_cli.py" bench serve)

source benchmarks/serve_lib.sh  # wait_healthy

for name in ${ORDER:-cadence vllm}; do
  log=$out/server_${name}_client_run.log
  case $name in
    vllm)
      port=8200
      (cd "$vllm_dir" && exec setsid ./start_vllm.sh > "$log" 2>&1) & ;;
    cadence | cadence-bf16)
      port=8766
      flags=()
      [ "$name" = cadence-bf16 ] && flags=(--quantization none --dtype bfloat16)
      # shellcheck disable=SC2206  # CADENCE_ARGS: more flags for both Cadence servers, split on spaces
      flags+=(${CADENCE_ARGS:-})
      # Which checkout serves: a .venv that is another checkout's editable install (or a
      # PYTHONPATH) decides it, not this folder. Said in the log and on the terminal.
      .venv/bin/python -c 'import cadence; print("cadence served from", cadence.__path__[0])' \
        | tee "$out/cadence_package.txt"
      .venv/bin/cadence serve --port $port --log-level warning --served-model-name smollm2 \
        "${flags[@]}" > "$log" 2>&1 & ;;
    llamacpp)
      port=8300
      gguf=$(cat "$(.venv/bin/python -c 'from cadence.loader.model_path import resolve_model_path as r; print(r(None))')/gguf_source")
      "${LLAMACPP_PY:-/work/llamacpp-venv/bin/python}" benchmarks/llamacpp_server.py --model "$gguf" \
        --model_alias smollm2 --host 127.0.0.1 --port $port --n_threads 2 --n_ctx 4096 \
        > "$log" 2>&1 & ;;
    *) echo "unknown server $name" >&2; exit 2 ;;
  esac
  server=$!
  ready=/health
  [ "$name" = llamacpp ] && ready=/v1/models  # llama-cpp-python has no /health
  wait_healthy $port $ready
  levels=${CONCURRENCY:-1 4 16}
  # llama-cpp-python's server runs one request at a time: compared at 1 and 4 only
  [ "$name" = llamacpp ] && levels=${LLAMACPP_CONCURRENCY:-1 4}
  for c in $levels; do
    prompts=${NUM_PROMPTS:-$((2 * c > 16 ? 2 * c : 16))}  # at least two rounds of c
    "${client[@]}" --backend openai --base-url "http://127.0.0.1:$port" --model smollm2 \
      --tokenizer "$vllm_dir/smollm2-hf" --dataset-name random --random-input-len 128 \
      --random-output-len 128 --num-prompts "$prompts" --max-concurrency $c --ignore-eos \
      --seed 0 2>&1 | sed -n '/Serving Benchmark Result/,/^====*$/p' \
      | tee "$out/vllm_client_${name}_c$c.log"
  done
  if [ "$name" = vllm ]; then kill -TERM -- -$server 2>/dev/null || true; fi
  kill $server 2>/dev/null || true
  wait $server 2>/dev/null || true
  sleep 2
done
