#!/usr/bin/env bash
# Issue 32's GPU runs (dummy weights), in parts so each fits one device call:
#   PARTS="tests sweep qwen"   the MoE GPU tests; the tile sweep (writes the table into
#                              this tree's cadence/ops/moe_tiles_h200.json and $OUT);
#                              Qwen3-30B-A3B bf16 at batch 1 and 64 (128 -> 256)
#   PARTS="qwen-fp8 qwen-tput start"   Qwen3-30B-A3B FP8 at batch 1 and 64; 256 x 1,024 ->
#                              256 in bf16; process start -> first token, cold Triton cache
#   PARTS="mixtral mixtral-fp8 mixtral-tput"   the same cases for Mixtral-8x7B
#   PARTS="qwen1 qwen1-fp8"     batch 1 alone
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
  grep -E "Throughput|Error|error" "$OUT/${name}_tput.log" | tail -4 | tee -a "$LOG"
  echo "   ($((SECONDS - t0)) s)" | tee -a "$LOG"
}
if has tests; then
  python3 -m pytest -q -m gpu tests/ops/test_fused.py tests/ops/test_fused_moe.py \
    tests/worker/test_cuda_runner.py -k "fused or moe or mixtral or granite or olmoe or qwen3" \
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
has qwen && { lat qwen3 qwen3-30b-a3b 1; lat qwen3 qwen3-30b-a3b 64; }
has qwen1 && lat qwen3 qwen3-30b-a3b 1  # (batch 1 alone: after a sweep of the thin tiles)
has qwen1-fp8 && lat qwen3_fp8 qwen3-30b-a3b 1 --quantization fp8
if has profile; then  # where a batch-1 decode step's time goes
  python3 benchmarks/profile_step.py benchmarks/qwen3-30b-a3b --batch-size 1 --output-len 64 \
    --prefill-tokens 2048 > "$OUT/profile_b1.log" 2>&1
  grep -A40 "kernel" "$OUT/profile_b1.log" | head -60 >> "$LOG"
fi
has qwen-fp8 && { lat qwen3_fp8 qwen3-30b-a3b 1 --quantization fp8; lat qwen3_fp8 qwen3-30b-a3b 64 --quantization fp8; }
has qwen-tput && tput qwen3 qwen3-30b-a3b
if has start; then
  start=$(date +%s.%N)
  TRITON_CACHE_DIR=$(mktemp -d) python3 - <<PY 2>&1 | grep -v " INFO " | tail -2 | tee -a "$LOG"
import time
t0 = $start
from cadence import LLM, SamplingParams
t1 = time.time()
llm = LLM("benchmarks/qwen3-30b-a3b", load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True)
llm.generate([[1, 2, 3]], SamplingParams(max_tokens=1), use_tqdm=False)
print(f"Qwen3-30B-A3B process start -> first token, cold Triton cache: {time.time() - t0:.1f} s")
PY
fi
has mixtral && { lat mixtral mixtral-8x7b 1; lat mixtral mixtral-8x7b 64; }
has mixtral-fp8 && { lat mixtral_fp8 mixtral-8x7b 1 --quantization fp8; lat mixtral_fp8 mixtral-8x7b 64 --quantization fp8; }
has mixtral-tput && tput mixtral mixtral-8x7b
exit 0
