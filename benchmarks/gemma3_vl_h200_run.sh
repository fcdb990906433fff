#!/usr/bin/env bash
# Issue 34, Gemma 3 (an image's tokens attend to each other both ways: key limits) on the
# H200; carry .whl and .gpu-smoke (benchmarks/device_wheels.sh). PARTS picks:
#   kernels  one layer's attention (benchmarks/attention_kernels.py, CUDA-graph replay) at
#            Llama-3.1-8B's heads (32/8 of 128) and Gemma 3's (8/4 of 256): these kernels,
#            then the ones before key limits ($OLD_KERNELS: a folder holding the three Triton
#            files of cadence/attention from before), then these again: one lease
#   tests    kernel B with key limits against the torch reference at real sizes, and the
#            tiny Gemma 3 against transformers on CUDA (chunked, preempted, cached, chat)
# Results under $OUT (or ./gemma3-out).
set -uo pipefail
OUT=${OUT:-gemma3-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
source benchmarks/device_env.sh
PARTS=${PARTS:-kernels tests}
has() { [[ " $PARTS " == *" $1 "* ]]; }
kernels() {  # $1: a label
  for shape in "32 8 128" "8 4 256"; do
    set -- "$1" $shape
    python3 benchmarks/attention_kernels.py --heads "$2" --kv-heads "$3" --head-dim "$4" \
      --no-torch > "$OUT/kernels_$1_d$4.log" 2>&1
  done
}
if has kernels; then
  kernels new
  if [ -n "${OLD_KERNELS:-}" ]; then
    mkdir -p /tmp/attention_new && cp cadence/attention/triton_*.py /tmp/attention_new/
    cp "$OLD_KERNELS"/triton_*.py cadence/attention/
    kernels old
    cp /tmp/attention_new/triton_*.py cadence/attention/
    kernels new_again
  fi
  grep "prefill\|decode b=64\|decode b=1 ctx=4k" "$OUT"/kernels_*.log | sed "s|$OUT/||"
fi
if has tests; then
  export CADENCE_TEST_TOKENIZER=.gpu-smoke/smollm2 PYTHONPATH=$PYTHONPATH:$PWD/tests
  python3 -m pytest -q tests/attention/test_triton_paged.py -k gpu -p no:cacheprovider \
    > "$OUT/kernel_tests.log" 2>&1
  tail -2 "$OUT/kernel_tests.log"
  python3 -m pytest -q tests/models/test_vision_language.py -p no:cacheprovider \
    -k "gemma3 and (greedy or chat or both_ways)" > "$OUT/gemma3_tests.log" 2>&1
  tail -2 "$OUT/gemma3_tests.log"
fi
