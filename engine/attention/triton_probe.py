"""Whether the Triton kernels compile and run on a device, found once at startup.

Importing triton says little about a GPU: a triton build may lack the card's
architecture (a new RDNA part on an older ROCm triton), or its compiler may fail. So
before ``auto`` picks Triton for a device, a tiny batch (a decode and a prefill chunk
after cached tokens, over a fragmented block table) runs through ``TritonAttention`` and
is compared with ``ReferenceAttention``. Any failure is logged with its reason and the
engine takes the SDPA path instead; it never fails at its first real step.
"""

from __future__ import annotations

import functools
import logging

import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.reference import ReferenceAttention
from engine.attention.triton_attention import TritonAttention

__all__ = ["triton_runs_on"]

logger = logging.getLogger(__name__)


@functools.cache
def triton_runs_on(device: torch.device, dtype: torch.dtype) -> bool:
    """Probe once per device and dtype (cached for the process)."""
    metadata = AttentionMetadata.build(
        block_size=16,
        query_lens=[1, 5],
        seq_lens=[20, 16],  # a decode over two blocks; a chunk of 5 after 11 cached tokens
        block_tables=[[3, 0], [2]],
        device=device,
    )
    gen = torch.Generator().manual_seed(0)
    shapes = {"q": (6, 4, 64), "k": (6, 2, 64), "v": (6, 2, 64), "cache": (4, 16, 2, 64)}
    t = {
        name: torch.randn(shape, generator=gen).to(device, dtype) for name, shape in shapes.items()
    }
    outs = []
    try:
        for backend in (TritonAttention(), ReferenceAttention()):
            key_cache, value_cache = t["cache"].clone(), t["cache"].flip(0)
            backend.prepare(metadata)
            outs.append(
                backend.forward(
                    t["q"], t["k"], t["v"], key_cache, value_cache, metadata, scale=0.125
                )
            )
    except Exception as exc:  # compile errors have many types; any means "not here"
        logger.warning(
            "Triton attention does not run on %s (%s): using the SDPA path. %s: %s",
            device,
            dtype,
            type(exc).__name__,
            exc,
        )
        return False
    got, want = (out.float().cpu() for out in outs)
    if not torch.allclose(got, want, atol=2e-2, rtol=2e-2):
        error = (got - want).abs().max().item()
        logger.warning(
            "Triton attention on %s (%s) differs from the reference by up to %.3g: "
            "using the SDPA path",
            device,
            dtype,
            error,
        )
        return False
    logger.info("Triton attention runs on %s (%s)", device, dtype)
    return True
