#!/usr/bin/env bash
# One-shot GPU check for a session with a lent CUDA or ROCm GPU: run from the repo root.
# Exits non-zero if torch sees no GPU or any step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
python - <<'PY'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "hip", torch.version.hip)
assert torch.cuda.is_available(), "torch sees no CUDA/ROCm GPU"
print("device", torch.cuda.get_device_name(0))
PY
python -m pytest -m gpu -q -p no:cacheprovider
kvgov bench engine --json
# Decode attention at a 9B model's head sizes, device-timed: Triton paged vs gather vs
# contiguous SDPA (the kernels' parity at 1k-16k tokens is in the gpu tests above).
kvgov bench attention --device cuda --json
echo "gpu_check: all passed"
