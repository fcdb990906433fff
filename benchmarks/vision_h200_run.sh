#!/usr/bin/env bash
# Issue 34's H200 run, Qwen2.5-VL-7B's shape with dummy bf16 weights (carry .whl and
# .gpu-smoke: SmolLM2's tokenizer, from benchmarks/device_wheels.sh):
#   1. offline (benchmarks/vision_h200.py): 64 requests of one 448x448 image + 64 text
#      tokens -> 128, batch 1 (with the encoder in its CUDA graph and without), the
#      encoder alone, the API side's preprocessing; (graph-tests: the encoder's graphs
#      against eager encodes)
#   2. served: `cadence serve` and `cadence bench serve --endpoint chat` over JSONL chats
#      with PNG data: URLs, 64 concurrent and 1 at a time (distinct images throughout); the
#      vocabulary cut to the tokenizer's 49,216 (see below).
# Results under $OUT (or ./vision-out).
set -uo pipefail
OUT=${OUT:-vision-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
source benchmarks/device_env.sh
source benchmarks/serve_lib.sh
TOK=.gpu-smoke/smollm2
PARTS=${PARTS:-tests offline served}
has() { [[ " $PARTS " == *" $1 "* ]]; }
python3 -c "import PIL, transformers; print('PIL', PIL.__version__, 'transformers', transformers.__version__)"
python3 -c "import torchvision; print('torchvision', torchvision.__version__)" 2>/dev/null || echo "no torchvision"
if has tests; then  # the families against transformers on CUDA: graphs replay M-RoPE decodes
  CADENCE_TEST_TOKENIZER=$TOK PYTHONPATH=$PYTHONPATH:$PWD/tests python3 -m pytest -q -x \
    tests/models/test_vision_language.py tests/security/test_image_inputs.py tests/multimodal \
    -p no:cacheprovider > "$OUT/tests.log" 2>&1
  tail -3 "$OUT/tests.log"
fi
if has graph-tests; then  # the encoder's CUDA graphs: replays against eager encodes
  CADENCE_TEST_TOKENIZER=$TOK PYTHONPATH=$PYTHONPATH:$PWD/tests python3 -m pytest -q \
    tests/worker/test_encoder_graphs.py -p no:cacheprovider > "$OUT/graph_tests.log" 2>&1
  tail -3 "$OUT/graph_tests.log"
fi
if has offline; then
  python3 benchmarks/vision_h200.py --tokenizer $TOK --json "$OUT/offline.json" > "$OUT/offline.log" 2>&1
  tail -5 "$OUT/offline.log"
fi
if has served; then
  # The vocabulary cut to the tokenizer's (rounded to 64): every sampled token has text, so
  # the client's TTFT is the first token's (with 152,064, most dummy tokens have none).
  FOLDER=$(python3 benchmarks/vision_h200.py --tokenizer $TOK --make-folder --vocab 49216 \
    2>/dev/null | tail -1)
  for spec in "warm 16 100" "c64 64 200" "c1 8 300"; do
    set -- $spec
    python3 benchmarks/vision_h200.py --tokenizer $TOK --dataset "$OUT/$1.jsonl" "$2" "$3"
  done
  python3 -m cadence.cli.main serve "$FOLDER" --load-format dummy --dtype bfloat16 \
    --max-model-len 4096 --port 8300 > "$OUT/serve.log" 2>&1 &
  SERVER=$!
  wait_healthy 8300 || { tail -20 "$OUT/serve.log"; exit 1; }
  for spec in "warm 16" "c64 64" "c1 1"; do
    set -- $spec
    python3 -m cadence.cli.main bench serve --port 8300 --endpoint chat --dataset-name jsonl \
      --dataset-path "$OUT/$1.jsonl" --max-concurrency "$2" --ignore-eos --num-warmups 0 \
      --tokenizer none --save-json "$OUT/served_$1.json" > "$OUT/served_$1.log" 2>&1
    grep -E "throughput|TTFT|ITL|TPOT|Successful|Failed" "$OUT/served_$1.log" | head -12
  done
  curl -s localhost:8300/metrics | grep -E "^cadence:(image|encoder)" > "$OUT/metrics.txt"
  kill $SERVER; wait $SERVER 2>/dev/null
fi
