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
# The step-time grid of an 8B model on this card, saved for refitting its twin profile later
# on any machine (kvgov twin fit --grid FILE --model llama-8b-random); the grid records the
# card's own name. The profile named is the nearest shipped one.
profile=$(python -c "import torch; n = torch.cuda.get_device_name(0)
print('h100-pcie' if 'PCIe' in n else 'mi300x' if 'MI300' in n else 'h100-sxm')")
kvgov twin fit --device cuda --model llama-8b-random --profile "$profile" --quick --json \
  --save-grid "${OUT:-.}/twin-grid-$profile.json" --out "${OUT:-.}/twin-profile-$profile.json"
echo "gpu_check: all passed"
