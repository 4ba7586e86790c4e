#!/usr/bin/env bash
# The swarm benchmark where moving KV costs something: llama-8b-random (Llama 3 8B's
# shape, 128 KiB of KV a token, random weights drawn on the GPU) on a lent CUDA or ROCm
# GPU, --quick (2 teams of 2 workers, 3 tool turns, 1 round: about 16 runs of a few
# seconds each, plus building the 15.6 GB model once per budget). On the CPU a swap to
# host memory is a memcpy next to a slow forward pass; here it crosses the host link.
# Run from the repo root after tests/gpu_check.sh; exits non-zero if torch sees no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA/ROCm GPU'"
kvgov bench swarm --quick --device cuda --model llama-8b-random --json
echo "gpu_swarm: done"
