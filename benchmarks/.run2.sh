set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
for t in tests/layers/test_fused.py tests/attention/test_triton_paged.py tests/worker/test_cuda_runner.py; do
  python3 -m pytest -q -m gpu "$t" -p no:cacheprovider 2>&1 | tee -a $OUT/tests.log | tail -3
done
python3 -m pytest -q tests/engine/test_correctness.py tests/engine/test_sampling.py -p no:cacheprovider 2>&1 | tee -a $OUT/tests.log | tail -3
python3 benchmarks/gpu_serve_check.py .gpu-smoke/smollm2 2>&1 | grep -v " INFO " | tee $OUT/serve.log | tail -14
M=benchmarks/llama-3.1-8b; C="--load-format dummy --dtype bfloat16"
lat() { python3 -m cadence.cli.main bench latency $M $C --input-len 128 --output-len 256 "$@" 2>&1 | grep -E "decode step|decode:|avg latency|prefill:" ; }
echo "== b1 default (qkv,o,down)"; lat --batch-size 1 --json $OUT/lat_b1.json
echo "== b1 CADENCE_GEMV=qkv,o,gate_up,down"; CADENCE_GEMV=qkv,o,gate_up,down lat --batch-size 1
echo "== b1 CADENCE_GEMV=o (the previous choice)"; CADENCE_GEMV=o lat --batch-size 1
echo "== b64"; lat --batch-size 64 --json $OUT/lat_b64.json
python3 benchmarks/hbm_bandwidth.py --json $OUT/hbm.json | tail -2
python3 benchmarks/profile_step.py $M --hbm-gbps 4270 --batch-size 1 --output-len 128 --json $OUT/prof_b1.json 2>&1 | grep -v " INFO \|^\[W\|USDT\|_warn_once\|UserWarn" | sed -n '/decode step, batch 1/,/prefill step/p'
