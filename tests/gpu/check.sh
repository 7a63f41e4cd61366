#!/usr/bin/env bash
# The GPU check (tests/gpu/check.py): needs only python with torch, transformers, peft and accelerate (vLLM
# for the tensor-parallel check, skipped without it); at most 10 minutes.
#   bash tests/gpu/check.sh                       # CUDA: Qwen2.5-0.5B-like and 7B-like random models in bf16
#   bash tests/gpu/check.sh --device cpu --small  # the same steps on a CPU
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
exec timeout 600 "$PYTHON" tests/gpu/check.py "$@"
