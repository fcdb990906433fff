#!/usr/bin/env bash
# Every GPU figure of issue 4 in one command, on the H200 (see benchmarks/RESULTS.md):
#   bash benchmarks/h200_run.sh            (results and logs under $OUT, or ./h200-out)
# Needs the wheels of benchmarks/device_wheels.sh in .whl/ (and, for PARTS=serve, the model
# folder it writes to .gpu-smoke/): carry both.
# PARTS picks sections (default: all of "startup tests serve bench sync profile"; "long"
# is benchmarks/long_context.py (issue 13's cases), "sweep" benchmarks/split_kv_sweep.py; "lat" is
# the batch-1 and batch-64 rows of "bench" alone, "sync" those rows without async
# scheduling). Under the device tool's 10-minute limit run it as two calls, e.g.
# PARTS="startup tests serve bench", then PARTS=profile. "serve" runs
# benchmarks/gpu_serve_check.py on the model folder SERVE_MODEL (default .gpu-smoke/smollm2).
set -uo pipefail
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
source benchmarks/device_env.sh
M=benchmarks/llama-3.1-8b
BENCH="python3 -m cadence.cli.main bench"
COMMON="--load-format dummy --dtype bfloat16"
LOG="$OUT/bench.log"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  python3 benchmarks/hbm_bandwidth.py --json "$OUT/hbm.json"
} 2>&1 | tee "$LOG"
PARTS=${PARTS:-startup tests serve bench sync profile}
has() { [[ " $PARTS " == *" $1 "* ]]; }
HBM=$(python3 -c "import json; print(json.load(open('$OUT/hbm.json'))['hbm_gbps'])")

# Process start -> first token, cold: an empty Triton cache (every kernel compiles), first.
if has startup; then
start=$(date +%s.%N)
TRITON_CACHE_DIR=$(mktemp -d) python3 - <<PY 2>&1 | tee "$OUT/startup.log" | grep -v " INFO " | tee -a "$LOG"
import logging, time
t0 = $start
logging.basicConfig(level=logging.INFO, format="%(relativeCreated)8.0f ms INFO %(name)s: %(message)s")
from cadence import LLM, SamplingParams
from triton.runtime.jit import JITFunction
_compile = JITFunction._do_compile
def _timed_compile(self, *a, **kw):  # which kernels compile at start-up, and for how long
    c0 = time.time()
    try:
        return _compile(self, *a, **kw)
    finally:
        logging.getLogger("triton-compile").info("%s %.2f s", self.fn.__name__, time.time() - c0)
JITFunction._do_compile = _timed_compile
t1 = time.time()
llm = LLM("$M", load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True)
t2 = time.time()
llm.generate([[1, 2, 3]], SamplingParams(max_tokens=1), use_tqdm=False)
t3 = time.time()
print(f"process start -> first token: {t3 - t0:.1f} s (interpreter + imports {t1 - t0:.1f} s, "
      f"engine {t2 - t1:.1f} s, first request {t3 - t2:.2f} s)")
PY
grep " INFO " "$OUT/startup.log" | sed 's/^/  /' | tee -a "$LOG"
fi

if has tests; then
  # One process per file: a CUDA error in one must not poison the other's context.
  for t in tests/worker/test_cuda_runner.py tests/ops/test_fused.py \
           tests/attention/test_triton_paged.py; do
    python3 -m pytest -q -m gpu "$t" -p no:cacheprovider -x 2>&1 | tee -a "$OUT/tests.log" | tail -2
  done
  python3 -m pytest -q tests/worker/test_block_tables.py -p no:cacheprovider 2>&1 \
    | tee -a "$OUT/tests.log" | tail -2
  # The engine's own suites on tiny models pick CUDA here: greedy equal to transformers
  # whatever the batch, budget or preemption, sampling, penalties, grammars, async steps.
  python3 -m pytest -q tests/engine tests/layers/test_sampler.py tests/loader/test_hf_config.py \
    -p no:cacheprovider 2>&1 | tee -a "$OUT/tests.log" | tail -4
fi
run() {
  name=$1; shift
  echo "== $name: $*" | tee -a "$LOG"
  $BENCH "$@" 2>&1 | grep -v " INFO cadence.engine.core\|it/s\]" | tee -a "$LOG" | tail -9
}
if has serve; then
  python3 benchmarks/gpu_serve_check.py "${SERVE_MODEL:-.gpu-smoke/smollm2}" 2>&1 \
    | grep -v " INFO " | tee -a "$OUT/serve.log" | tee -a "$LOG"
fi
# Defaults: async scheduling and CUDA graphs on, token budget 8192.
if has bench || has lat; then
run lat_b1 latency $M $COMMON --batch-size 1 --input-len 128 --output-len 256 --json "$OUT/lat_b1.json"
run lat_b64 latency $M $COMMON --batch-size 64 --input-len 128 --output-len 256 --json "$OUT/lat_b64.json"
fi
if has bench; then
run tput_128 throughput $M $COMMON --num-prompts 256 --input-len 128 --output-len 256
run tput_1024 throughput $M $COMMON --num-prompts 256 --input-len 1024 --output-len 256
run lat_b1_eager latency $M $COMMON --batch-size 1 --input-len 128 --output-len 256 --enforce-eager --num-iters 1
run lat_b64_eager latency $M $COMMON --batch-size 64 --input-len 128 --output-len 256 --enforce-eager --num-iters 1
fi
# Long contexts (issue 13): decode tok/s and T_1 by batch and prompt length, the split-KV
# and prefill-tile sweeps.
if has sweep; then
  python3 benchmarks/split_kv_sweep.py --json "$OUT/split_kv_sweep.json" 2>&1 | tee -a "$LOG"
fi
if has long; then
  python3 benchmarks/long_context.py $M --hbm-gbps "$HBM" --json "$OUT/long_context.json" 2>&1 \
    | grep -v " INFO " | tee -a "$LOG"
fi
# What async scheduling buys: the same latency runs with it off.
if has sync; then
run lat_b1_sync latency $M $COMMON --batch-size 1 --input-len 128 --output-len 256 --no-async-scheduling --num-iters 2
run lat_b64_sync latency $M $COMMON --batch-size 64 --input-len 128 --output-len 256 --no-async-scheduling --num-iters 2
fi
# Where the time goes: host phases per step, GPU kernel time by class, against the floor.
prof() {
  echo "== profile $*" | tee -a "$LOG"
  python3 benchmarks/profile_step.py $M --hbm-gbps "$HBM" "$@" 2>&1 \
    | grep -v " INFO \|^\[W\|USDT\|_warn_once\|UserWarn" | tee -a "$LOG" | tail -60
}
if has profile; then
prof --batch-size 1 --output-len 128 --json "$OUT/prof_b1.json"
prof --batch-size 64 --output-len 128 --prefill-tokens 0 --json "$OUT/prof_b64.json"
prof --batch-size 256 --input-len 1024 --output-len 64 --prefill-tokens 0 --mixed-step 16 --json "$OUT/prof_b256.json"
fi
