"""Host values on the device without blocking the host: every host-to-device copy of a step.

On CUDA and ROCm a ``non_blocking`` copy from pageable host memory is not asynchronous:
the driver first copies into its own pinned buffer, and on HIP the call returns only
once the copy is done, after the compute already queued on the stream. So a host tensor
bound for a GPU is built in (or first copied to) pinned memory, and the copy from there
is queued without the host waiting. Torch's pinned allocator keeps such a buffer until
the copy that reads it has run, so the caller may drop it at once.

On a CPU the host tensor is the result (no copy, nothing pinned: a CPU-only torch raises
on ``pin_memory``). On another accelerator (xpu, mps) the copy is a plain, blocking one.

``tests/engine/test_host_staging.py`` fails on any ``non_blocking`` copy in ``engine/``
that does not come through here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["pinned_host", "stage_tensor", "stage_values"]


def pinned_host(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """What a copy of ``host`` (a CPU tensor) to ``device`` reads from: ``host`` itself,
    or on CUDA/ROCm a pinned copy of it unless it is pinned already."""
    if device.type != "cuda" or host.is_pinned():
        return host
    return host.pin_memory()


def stage_tensor(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` (a CPU tensor) on ``device``; on a CUDA/ROCm device, copied from pinned
    memory on the current stream, the host not waiting."""
    if device.type == "cpu":
        return host
    if device.type != "cuda":
        return host.to(device)
    return pinned_host(host, device).to(device, non_blocking=True)


def stage_values(
    values: Sequence[int] | Sequence[float], *, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A new 1-d tensor of ``values`` on ``device`` (``stage_tensor``), built in pinned
    memory in the first place where it is bound for CUDA/ROCm."""
    host = torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")
    return stage_tensor(host, device)
