#!/usr/bin/env bash
# Every GPU figure of issue 4 in one command, on the H200 (see benchmarks/RESULTS.md):
#   bash benchmarks/h200_run.sh            (results and logs under $OUT, or ./h200-out)
# Needs the wheels of ../shared/tools/device-wheels in .whl/ when the machine lacks them.
# SKIP_TESTS=1 skips the gpu-marked tests; SKIP_BENCH=1 the benchmarks.
set -uo pipefail
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
M=benchmarks/llama-3.1-8b
BENCH="python3 -m cadence.cli.main bench"
COMMON="--load-format dummy --dtype bfloat16"
LOG="$OUT/bench.log"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  python3 benchmarks/hbm_bandwidth.py --json "$OUT/hbm.json"
} 2>&1 | tee "$LOG"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  # One process per file: a CUDA error in one must not poison the other's context.
  for t in tests/worker/test_cuda_runner.py tests/layers/test_fused.py tests/attention/test_triton_paged.py; do
    python3 -m pytest -q -m gpu "$t" -p no:cacheprovider -x 2>&1 | tee -a "$OUT/tests.log" | tail -5
  done
fi
[ "${SKIP_BENCH:-0}" = 1 ] && exit 0
# process start -> first token (cold: no compile cache of ours exists)
start=$(date +%s.%N)
python3 - <<PY 2>&1 | grep -v "^[0-9:]* INFO" | tee -a "$LOG" | tail -3
import time
from cadence import LLM, SamplingParams
llm = LLM("$M", load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True)
llm.generate([[1, 2, 3]], SamplingParams(max_tokens=1), use_tqdm=False)
print(f"process start -> first token: {time.time() - $start:.1f} s")
PY
run() {
  name=$1; shift
  echo "== $name: $*" | tee -a "$LOG"
  $BENCH "$@" 2>&1 | grep -v "^[0-9:]* INFO cadence.engine.core\|it/s\]" | tee -a "$LOG" | tail -12
}
run lat_b1 latency $M $COMMON --batch-size 1 --input-len 128 --output-len 256 --json "$OUT/lat_b1.json"
run lat_b64 latency $M $COMMON --batch-size 64 --input-len 128 --output-len 256 --json "$OUT/lat_b64.json"
run lat_b1_eager latency $M $COMMON --batch-size 1 --input-len 128 --output-len 256 --enforce-eager --num-iters 1
run lat_b64_eager latency $M $COMMON --batch-size 64 --input-len 128 --output-len 256 --enforce-eager --num-iters 1
run tput_128 throughput $M $COMMON --num-prompts 256 --input-len 128 --output-len 256
run tput_1024 throughput $M $COMMON --num-prompts 256 --input-len 1024 --output-len 256
run tput_1024_8k throughput $M $COMMON --num-prompts 256 --input-len 1024 --output-len 256 --max-num-batched-tokens 8192
# Async scheduling (not yet measured when this script was written)
run lat_b1_async latency $M $COMMON --batch-size 1 --input-len 128 --output-len 256 --async-scheduling
run lat_b64_async latency $M $COMMON --batch-size 64 --input-len 128 --output-len 256 --async-scheduling
run tput_128_async throughput $M $COMMON --num-prompts 256 --input-len 128 --output-len 256 --async-scheduling
