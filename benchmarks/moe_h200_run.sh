#!/usr/bin/env bash
# Issue 32's GPU runs (dummy weights), in parts so each fits one device call:
#   PARTS="tests sweep qwen"   the MoE GPU tests; the tile sweep (writes the table into
#                              this tree's cadence/ops/moe_tiles_h200.json and $OUT);
#                              Qwen3-30B-A3B bf16 at batch 1 and 64 (128 -> 256)
#   PARTS="qwen-fp8 qwen-tput start"   Qwen3-30B-A3B FP8 at batch 1 and 64; 256 x 1,024 ->
#                              256 in bf16; process start -> first token, cold Triton cache
#   PARTS="mixtral mixtral-fp8 mixtral-tput"   the same cases for Mixtral-8x7B
#   PARTS="qwen1 qwen1-fp8"     batch 1 alone
#   PARTS="gptoss gptoss-fp8 gptoss-start"   GPT-OSS-20B's shape (bf16 experts, as its MXFP4
#                              checkpoint dequantizes at load): batch 1 and 64, FP8, start
#   PARTS="mla-tests deepseek deepseek-fp8 deepseek-tput deepseek-start"   DeepSeek-V2-Lite's
#                              shape: the latent-attention GPU tests, batch 1 and 64,
#                              FP8, 256 x 1,024 -> 256, start
#   PARTS="pairs qwen1 mixtral1"   the per-pair GEMVs (cadence/ops/moe_pairs.py): their GPU
#                              tests, then benchmarks/moe_pairs_sweep.py against the grouped
#                              GEMMs at T <= 32 (writes "pairs" tiles into this tree's
#                              table and $OUT where they win); then batch 1 end to end
#   PARTS="groups qwen-tput mixtral-tput"   the grouped GEMMs' program order in prefill-sized
#                              steps: benchmarks/moe_group_sweep.py writes GROUP_M into the
#                              tiles where it wins (this tree's table and $OUT); then
#                              256 x 1,024 -> 256 for both models
#   PARTS="gmm qwen-tput mixtral-tput"   torch's grouped GEMM (cadence/ops/moe_grouped_mm.py):
#                              its GPU tests, then benchmarks/moe_grouped_mm_sweep.py against
#                              the Triton GEMMs at 64-8,192 tokens (writes "grouped_mm" into
#                              this tree's table and $OUT where it wins); then 256 x 1,024;
#                              PARTS=gmm-tests: the fused-MoE and MoE-model GPU tests
#   PARTS="gmm-fp8 qwen-fp8-tput mixtral-fp8-tput"   FP8 experts through torch's scaled grouped
#                              GEMM (W8A8): the GPU tests, then the sweep against the Triton
#                              W8A16 GEMMs at 256-8,192 tokens (writes "grouped_mm" into the fp8
#                              entries of this tree's table and $OUT where it wins); then 256 x
#                              1,024 -> 256 with FP8
#   PARTS="w8a8 fp8-b64 qwen-fp8-tput"   FP8 decodes through the swapped W8A8 GEMMs
#                              (cadence/ops/moe_w8a8.py): their GPU tests, then
#                              benchmarks/moe_w8a8_sweep.py against the W8A16 GEMMs at 8-256
#                              tokens (writes "w8a8" tiles into this tree's table and $OUT
#                              where they win); then the FP8 cases they decide
#   PARTS="norm-tests qwen1 qwen1-unfused"   per-head q / k norms in the attention backend's
#                              kernel A, and the norm + router gemv at batch 1: their GPU
#                              tests (kernel cases, Qwen3 / Gemma models in graphs), then
#                              batch 1 with them and without (CADENCE_BACKEND_HEAD_NORMS=0
#                              CADENCE_GEMV=o), in one lease
#   PARTS=attn-sweep           kernel B's prefill tiles on 8 x 1,024-token prompts, 32 / 4
#                              heads (Qwen3-30B-A3B) and 32 / 8 (benchmarks/split_kv_sweep.py)
#   PARTS=expert-gemm          a large step's expert GEMMs: torch's grouped GEMM against a cuBLAS
#                              GEMM per expert (benchmarks/moe_expert_gemm_bench.py)
#   PARTS="qwen-fp8-tput mixtral-fp8-tput"   256 x 1,024 -> 256 with FP8 experts and layers
#   PARTS=mixtral64            Mixtral-8x7B bf16 batch 64 alone
#   PARTS=fp8-b64              both models' FP8 batch 64 alone
#   PARTS=fp8-rows             the per-row FP8 quantizer: GPU tests, benchmarks/fp8_rows_bench.py
#   PARTS=silu                 fused.silu_and_mul against the bandwidth (benchmarks/silu_mul_bench.py)
#   PARTS=gpu-tests            norm-tests' and gmm-tests' tests in one run, with the GGUF
#                              experts expanded on CUDA (tests/loader/test_gguf_moe.py);
#                              GPU_TESTS_S=555 lets the whole run finish (~420 s) in a call
#                              of its own
#   PARTS="profile profile-prefill profile-mixtral profile-qwen-fp8"   benchmarks/profile_step.py: Qwen3-30B-A3B's
#                              batch-1 decode step; the throughput case's phases (a batch-256
#                              decode step, a mixed step, an 8,192-token prefill) on Qwen3-30B-A3B
#                              and Mixtral-8x7B
#   OUT=moe-out PARTS=... bash benchmarks/moe_h200_run.sh      (carry .whl)
# One JSON and log per case under $OUT; moe.log gathers the lines that matter.
set -uo pipefail
OUT=${OUT:-moe-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
source benchmarks/device_env.sh
PARTS=${PARTS:-tests sweep qwen}
has() { [[ " $PARTS " == *" $1 "* ]]; }
LOG="$OUT/moe.log"
COMMON="--load-format dummy --dtype bfloat16"
lat() {  # lat NAME MODEL BATCH [flags]: `bench latency` at 128 -> 256
  local name=$1 model=$2 b=$3; shift 3
  local t0=$SECONDS
  echo "== $name b$b $*" | tee -a "$LOG"
  python3 -m cadence.cli.main bench latency "benchmarks/$model" $COMMON --batch-size "$b" \
    --input-len 128 --output-len 256 --num-iters 2 --json "$OUT/${name}_b$b.json" "$@" \
    > "$OUT/${name}_b$b.log" 2>&1
  grep -E "^(avg latency|prefill|decode)|loaded|Error|error" "$OUT/${name}_b$b.log" | tail -6 | tee -a "$LOG"
  echo "   ($((SECONDS - t0)) s)" | tee -a "$LOG"
}
tput() {  # tput NAME MODEL [flags]: 256 prompts x 1,024 -> 256
  local name=$1 model=$2; shift 2
  local t0=$SECONDS
  echo "== $name 256x1024->256 $*" | tee -a "$LOG"
  python3 -m cadence.cli.main bench throughput "benchmarks/$model" $COMMON --num-prompts 256 \
    --input-len 1024 --output-len 256 --json "$OUT/${name}_tput.json" "$@" \
    > "$OUT/${name}_tput.log" 2>&1
  grep -E "Throughput|preemptions:|memory profile|Error|error" "$OUT/${name}_tput.log" | tail -5 | tee -a "$LOG"
  echo "   ($((SECONDS - t0)) s)" | tee -a "$LOG"
}
if has tests; then
  python3 -m pytest -q -m gpu tests/ops/test_fused.py tests/ops/test_fused_moe.py \
    tests/worker/test_cuda_runner.py tests/attention/test_triton_paged.py \
    -k "fused or moe or mixtral or granite or olmoe or qwen3 or gpt or sinks" \
    -p no:cacheprovider 2>&1 | tail -6 | tee -a "$LOG"
fi
if has sweep; then
  t0=$SECONDS
  timeout "${SWEEP_S:-330}" python3 benchmarks/moe_tile_sweep.py --out "$OUT/moe_tiles_h200.json" --jobs 14 \
    > "$OUT/sweep.log" 2>&1
  tail -3 "$OUT/sweep.log" | tee -a "$LOG"
  grep -E "T=(1|64|1024):" "$OUT/sweep.log" | tee -a "$LOG"
  [ -s "$OUT/moe_tiles_h200.json" ] && cp "$OUT/moe_tiles_h200.json" cadence/ops/moe_tiles_h200.json
  echo "   sweep ($((SECONDS - t0)) s)" | tee -a "$LOG"
fi
if has pairs; then
  t0=$SECONDS
  python3 -m pytest -q -m gpu tests/ops/test_fused_moe.py tests/worker/test_cuda_runner.py \
    -k "fused_moe or pair" -p no:cacheprovider 2>&1 | tail -3 | tee -a "$LOG"
  timeout "${SWEEP_S:-400}" python3 benchmarks/moe_pairs_sweep.py --jobs 14 \
    --table cadence/ops/moe_tiles_h200.json --out "$OUT/moe_tiles_h200.json" > "$OUT/pairs_sweep.log" 2>&1
  grep -E "T=|compiled|wrote|Error" "$OUT/pairs_sweep.log" | tee -a "$LOG"
  [ -s "$OUT/moe_tiles_h200.json" ] && cp "$OUT/moe_tiles_h200.json" cadence/ops/moe_tiles_h200.json
  echo "   pairs sweep ($((SECONDS - t0)) s)" | tee -a "$LOG"
fi
if has groups; then
  t0=$SECONDS
  timeout "${SWEEP_S:-300}" python3 benchmarks/moe_group_sweep.py \
    --table cadence/ops/moe_tiles_h200.json --out "$OUT/moe_tiles_h200.json" > "$OUT/group_sweep.log" 2>&1
  grep -E "T=(1024|4096|8192)|wrote|Error" "$OUT/group_sweep.log" | tee -a "$LOG"
  [ -s "$OUT/moe_tiles_h200.json" ] && cp "$OUT/moe_tiles_h200.json" cadence/ops/moe_tiles_h200.json
  echo "   group sweep ($((SECONDS - t0)) s)" | tee -a "$LOG"
fi
if has gmm; then  # torch's grouped GEMM against the Triton GEMMs in large steps (16-bit)
  t0=$SECONDS
  python3 -m pytest -q -m gpu tests/ops/test_moe_grouped_mm.py tests/ops/test_fused.py \
    -p no:cacheprovider 2>&1 | tail -3 | tee -a "$LOG"
  timeout "${SWEEP_S:-240}" python3 benchmarks/moe_grouped_mm_sweep.py \
    --table cadence/ops/moe_tiles_h200.json --out "$OUT/moe_tiles_h200.json" > "$OUT/gmm_sweep.log" 2>&1
  grep -E "T=|cannot|capture|wrote|Error" "$OUT/gmm_sweep.log" | tee -a "$LOG"
  [ -s "$OUT/moe_tiles_h200.json" ] && cp "$OUT/moe_tiles_h200.json" cadence/ops/moe_tiles_h200.json
  echo "   grouped_mm sweep ($((SECONDS - t0)) s)" | tee -a "$LOG"
fi
if has gmm-fp8; then  # FP8 experts: torch's scaled grouped GEMM (W8A8) against Triton's W8A16
  t0=$SECONDS
  python3 -m pytest -q -m gpu tests/ops/test_moe_grouped_mm.py tests/ops/test_fp8_rows.py \
    tests/quant/test_quant_triton.py -p no:cacheprovider 2>&1 | tail -3 | tee -a "$LOG"
  timeout "${SWEEP_S:-240}" python3 benchmarks/moe_grouped_mm_sweep.py --dtypes fp8 \
    --batches 256 512 1024 2048 4096 8192 --table cadence/ops/moe_tiles_h200.json \
    --out "$OUT/moe_tiles_h200.json" > "$OUT/gmm_fp8_sweep.log" 2>&1
  grep -E "T=|cannot|capture|wrote|Error" "$OUT/gmm_fp8_sweep.log" | tee -a "$LOG"
  [ -s "$OUT/moe_tiles_h200.json" ] && cp "$OUT/moe_tiles_h200.json" cadence/ops/moe_tiles_h200.json
  echo "   grouped_mm fp8 sweep ($((SECONDS - t0)) s)" | tee -a "$LOG"
fi
if has w8a8; then  # FP8 decodes: the swapped W8A8 GEMMs against the W8A16 ones
  t0=$SECONDS
  python3 -m pytest -q -m gpu tests/ops/test_moe_w8a8.py -p no:cacheprovider 2>&1 | tail -3 \
    | tee -a "$LOG"
  timeout "${SWEEP_S:-240}" python3 benchmarks/moe_w8a8_sweep.py --jobs 14 \
    --table cadence/ops/moe_tiles_h200.json --out "$OUT/moe_tiles_h200.json" > "$OUT/w8a8_sweep.log" 2>&1
  grep -E "T=|compiled|wrote|Error" "$OUT/w8a8_sweep.log" | tee -a "$LOG"
  [ -s "$OUT/moe_tiles_h200.json" ] && cp "$OUT/moe_tiles_h200.json" cadence/ops/moe_tiles_h200.json
  echo "   w8a8 sweep ($((SECONDS - t0)) s)" | tee -a "$LOG"
fi
if has fp8-rows; then  # the per-row FP8 quantizer's tests and its bandwidth at prefill shapes
  python3 -m pytest -q -m gpu tests/ops/test_fp8_rows.py tests/ops/test_moe_grouped_mm.py \
    tests/quant/test_quant_triton.py -p no:cacheprovider 2>&1 | tail -3 | tee -a "$LOG"
  timeout 120 python3 benchmarks/fp8_rows_bench.py > "$OUT/fp8_rows.log" 2>&1
  tee -a "$LOG" < "$OUT/fp8_rows.log" | tail -12
fi
if has gmm-tests; then  # the fused-MoE kernels and the MoE / per-head-norm models in graphs
  python3 -m pytest -q -m gpu tests/ops/test_fused_moe.py tests/worker/test_cuda_runner.py \
    -k "fused_moe or pair or qwen3 or mixtral or gemma or granite or olmoe" -p no:cacheprovider \
    2>&1 | tail -3 | tee -a "$LOG"
fi
if has gpu-tests; then  # norm-tests and gmm-tests in one pytest, and GGUF experts on CUDA
  # The files a lease has run least come first; GPU_TESTS_S bounds the pytest (a call has 600 s).
  timeout "${GPU_TESTS_S:-330}" python3 -m pytest -q -m gpu tests/ops/test_fused.py \
    tests/loader/test_gguf_moe.py tests/ops/test_fused_moe.py tests/ops/test_moe_grouped_mm.py \
    tests/worker/test_cuda_runner.py tests/attention/test_triton_paged.py -p no:cacheprovider \
    -k "gpu or head_norm or on_cuda or fused_moe or pair or qwen3 or mixtral or gemma or granite or olmoe or grouped" \
    2>&1 | tee "$OUT/gpu_tests.log" | tail -15 | tee -a "$LOG"
fi
if has attn-sweep; then  # kernel B's prefill tile at Qwen3's 8-head groups (8 x 1,024 tokens)
  for kv in ${ATTN_KV:-4 8}; do  # Qwen3-30B-A3B's 32 / 4 heads, then Llama's 32 / 8
    timeout 150 python3 benchmarks/split_kv_sweep.py --part prefill --kv-heads $kv --prompts 8 \
      --length 1024 > "$OUT/attn_sweep_kv$kv.log" 2>&1
    grep -E "best|Error" "$OUT/attn_sweep_kv$kv.log" | tee -a "$LOG"
  done
fi
if has expert-gemm; then  # torch's grouped GEMM against a cuBLAS GEMM per expert, prefill sizes
  timeout 240 python3 benchmarks/moe_expert_gemm_bench.py > "$OUT/expert_gemm.log" 2>&1
  tee -a "$LOG" < "$OUT/expert_gemm.log" | tail -4
fi
if has silu; then  # silu_and_mul at prefill-step shapes, GB/s
  timeout 120 python3 benchmarks/silu_mul_bench.py > "$OUT/silu_mul.log" 2>&1
  tee -a "$LOG" < "$OUT/silu_mul.log" | tail -4
fi
if has norm-tests; then  # kernel A's per-head norms, the norm + router gemv, whole models
  timeout 330 python3 -m pytest -q -m gpu tests/attention/test_triton_paged.py tests/worker/test_cuda_runner.py \
    tests/ops/test_fused.py -k "head_norm or qwen3 or gemma or on_cuda" \
    -p no:cacheprovider 2>&1 | tail -3 | tee -a "$LOG"
fi
has mixtral1 && lat mixtral mixtral-8x7b 1
has qwen && { lat qwen3 qwen3-30b-a3b 1; lat qwen3 qwen3-30b-a3b 64; }
has qwen1 && lat qwen3 qwen3-30b-a3b 1  # (batch 1 alone: after a sweep of the thin tiles)
has qwen1-unfused && CADENCE_BACKEND_HEAD_NORMS=0 CADENCE_GEMV=o lat qwen3_unfused qwen3-30b-a3b 1
has qwen1-qkv && CADENCE_GEMV=o,router,qkv lat qwen3_qkv qwen3-30b-a3b 1  # the qkv gemv too
has qwen1-fp8 && lat qwen3_fp8 qwen3-30b-a3b 1 --quantization fp8
if has profile; then  # where a batch-1 decode step's time goes
  python3 benchmarks/profile_step.py benchmarks/qwen3-30b-a3b --batch-size 1 --output-len 64 \
    --prefill-tokens 2048 > "$OUT/profile_b1.log" 2>&1
  grep -A40 "kernel" "$OUT/profile_b1.log" | head -60 >> "$LOG"
fi
profile_tput() {  # profile_tput NAME MODEL: the throughput case's phases (256 x 1,024 -> 256):
  # the whole batch's prefill-carrying and decode-only seconds, a batch-256 decode step at
  # ~1,030 tokens of context, a mixed step (~128 decodes + prompt chunks), an 8,192-token
  # prefill step
  local name=$1 model=$2; shift 2
  python3 benchmarks/profile_step.py "benchmarks/$model" --batch-size 256 --input-len 1024 \
    --output-len 256 --mixed-step 16 --prefill-tokens 8192 --async-scheduling \
    --hbm-gbps 4200 --json "$OUT/profile_$name.json" "$@" > "$OUT/profile_$name.log" 2>&1
  grep -vE " INFO |UserWarning|_warn_once" "$OUT/profile_$name.log" | tail -80 >> "$LOG"
}
has profile-prefill && profile_tput qwen3_tput qwen3-30b-a3b
has profile-mixtral && profile_tput mixtral_tput mixtral-8x7b
has profile-qwen-fp8 && profile_tput qwen3_fp8_tput qwen3-30b-a3b --quantization fp8
has qwen-fp8 && { lat qwen3_fp8 qwen3-30b-a3b 1 --quantization fp8; lat qwen3_fp8 qwen3-30b-a3b 64 --quantization fp8; }
has qwen-tput && tput qwen3 qwen3-30b-a3b
has qwen-fp8-tput && tput qwen3_fp8 qwen3-30b-a3b --quantization fp8
start_time() {  # start_time MODEL NAME: process start -> first token, cold Triton cache
  local start
  start=$(date +%s.%N)
  TRITON_CACHE_DIR=$(mktemp -d) python3 - <<PY 2>&1 | grep -v " INFO " | tail -2 | tee -a "$LOG"
import time
t0 = $start
from cadence import LLM, SamplingParams
llm = LLM("benchmarks/$1", load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True)
llm.generate([[1, 2, 3]], SamplingParams(max_tokens=1), use_tqdm=False)
print(f"$2 process start -> first token, cold Triton cache: {time.time() - t0:.1f} s")
PY
}
has start && start_time qwen3-30b-a3b Qwen3-30B-A3B
has mixtral && { lat mixtral mixtral-8x7b 1; lat mixtral mixtral-8x7b 64; }
has mixtral64 && lat mixtral mixtral-8x7b 64
has mixtral-fp8 && { lat mixtral_fp8 mixtral-8x7b 1 --quantization fp8; lat mixtral_fp8 mixtral-8x7b 64 --quantization fp8; }
has mixtral-tput && tput mixtral mixtral-8x7b
has mixtral-fp8-tput && tput mixtral_fp8 mixtral-8x7b --quantization fp8
has fp8-b64 && { lat qwen3_fp8 qwen3-30b-a3b 64 --quantization fp8; lat mixtral_fp8 mixtral-8x7b 64 --quantization fp8; }
has gptoss && { lat gptoss gpt-oss-20b 1; lat gptoss gpt-oss-20b 64; }
has gptoss-fp8 && { lat gptoss_fp8 gpt-oss-20b 1 --quantization fp8; lat gptoss_fp8 gpt-oss-20b 64 --quantization fp8; }
has gptoss-start && start_time gpt-oss-20b GPT-OSS-20B
if has mla-tests; then
  python3 -m pytest -q -m gpu tests/attention/test_triton_mla.py tests/worker/test_cuda_runner.py \
    -k "mla or latent or deepseek" -p no:cacheprovider 2>&1 | tail -6 | tee -a "$LOG"
fi
has deepseek && { lat deepseek deepseek-v2-lite 1; lat deepseek deepseek-v2-lite 64; }
has deepseek-fp8 && { lat deepseek_fp8 deepseek-v2-lite 1 --quantization fp8; lat deepseek_fp8 deepseek-v2-lite 64 --quantization fp8; }
has deepseek-tput && tput deepseek deepseek-v2-lite
has deepseek-start && start_time deepseek-v2-lite DeepSeek-V2-Lite
exit 0
