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
# The engine on the GPU against transformers on the same GPU: prefill-logit parity within
# the dtype's tolerance (not identical greedy tokens), decode throughput side by side, the
# allocator's peak reserved after full-batch steps (peak_reserved_gib); the int8/int4 error
# figures and the sync-free step and side-stream swap tests are in -m gpu above.
kvgov bench engine --quick --device cuda --json
# Decode attention at a 9B model's head sizes, device-timed: Triton paged vs gather vs
# contiguous SDPA (the kernels' parity at 1k-16k tokens is in the gpu tests above).
kvgov bench attention --device cuda --json
echo "gpu_check: all passed"
