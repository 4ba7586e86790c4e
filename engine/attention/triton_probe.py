"""Whether the Triton kernels compile and run on a device for a model, found at startup.

Importing triton says little about a GPU: a triton build may lack the card's
architecture (a new RDNA part on an older ROCm triton), or its compiler may fail on one
head size, GQA ratio or dtype and not another (each is a constexpr). So before ``auto``
picks Triton for a device, the model's own ``AttentionShape`` runs through
``TritonAttention`` and is compared with ``ReferenceAttention``: a batch of decodes and
a prefill chunk after cached tokens, over fragmented block tables, once with the decodes
split into partitions (so the partitioned kernel and ``decode_merge`` compile too) and
once not. Any failure is logged on one line with its reason and the engine takes the
SDPA path instead; it never fails at its first real step. The answer is cached per
device and shape (the shape holds the dtype).
"""

from __future__ import annotations

import functools
import logging

import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.reference import ReferenceAttention
from engine.attention.shape import AttentionShape
from engine.attention.triton_attention import TritonAttention

__all__ = ["probe_backends", "triton_runs_on"]

logger = logging.getLogger(__name__)

# Two decodes (one of 300 tokens, cut into partitions; one of 20, whose later partitions
# are empty) and a chunk of 5 tokens after 11 cached ones.
_QUERY_LENS = (1, 1, 5)
_SEQ_LENS = (300, 20, 16)
_MIN_PARTITION = 64  # the split probe's shortest partition: 300 tokens make 3
_TOLERANCE = {torch.float32: 1e-4}  # else 2e-2: a half-precision output's own rounding


def probe_backends() -> tuple[TritonAttention, TritonAttention]:
    """The probe's two Triton backends: one that splits every decode, one that never does."""
    split = TritonAttention(target_programs=1 << 20, min_partition_tokens=_MIN_PARTITION)
    return split, TritonAttention(target_programs=1)


@functools.cache
def triton_runs_on(device: torch.device, shape: AttentionShape) -> bool:
    """Probe once per device and shape (cached for the process)."""
    metadata, inputs = _batch(device, shape)
    scale = shape.head_dim**-0.5
    try:
        want = _attend(ReferenceAttention(), metadata, inputs, scale)
        outs = [_attend(backend, metadata, inputs, scale) for backend in probe_backends()]
    except Exception as exc:  # compile errors have many types; any means "not here"
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line
        logger.warning(
            "Triton attention does not run on %s for %s: using the SDPA path. %s",
            device,
            _describe(shape),
            reason[:500],
        )
        return False
    tolerance = _TOLERANCE.get(shape.dtype, 2e-2)
    error = max((out.float() - want.float()).abs().max().item() for out in outs)
    if not error <= tolerance:  # NaN fails too
        logger.warning(
            "Triton attention on %s for %s differs from the reference by up to %.3g: "
            "using the SDPA path",
            device,
            _describe(shape),
            error,
        )
        return False
    logger.info("Triton attention runs on %s for %s", device, _describe(shape))
    return True


def _batch(
    device: torch.device, shape: AttentionShape
) -> tuple[AttentionMetadata, dict[str, torch.Tensor]]:
    block = shape.block_size
    widths = [-(-n // block) for n in _SEQ_LENS]
    ids = list(range(sum(widths)))[::-1]  # every table runs backwards: no contiguous run
    tables = [ids[sum(widths[:i]) : sum(widths[: i + 1])] for i in range(len(widths))]
    metadata = AttentionMetadata.build(
        block_size=block,
        query_lens=_QUERY_LENS,
        seq_lens=_SEQ_LENS,
        block_tables=tables,
        device=device,
    )
    tokens, d = sum(_QUERY_LENS), shape.head_dim
    sizes = {
        "q": (tokens, shape.num_heads, d),
        "k": (tokens, shape.num_kv_heads, d),
        "v": (tokens, shape.num_kv_heads, d),
        "key_cache": (len(ids), block, shape.num_kv_heads, d),
        "value_cache": (len(ids), block, shape.num_kv_heads, d),
    }
    gen = torch.Generator().manual_seed(0)
    inputs = {
        name: torch.randn(size, generator=gen).to(device, shape.dtype)
        for name, size in sizes.items()
    }
    return metadata, inputs


def _attend(
    backend: ReferenceAttention | TritonAttention,
    metadata: AttentionMetadata,
    inputs: dict[str, torch.Tensor],
    scale: float,
) -> torch.Tensor:
    key_cache, value_cache = inputs["key_cache"].clone(), inputs["value_cache"].clone()
    backend.prepare(metadata)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    return backend.forward(q, k, v, key_cache, value_cache, metadata, scale=scale)


def _describe(shape: AttentionShape) -> str:
    return (
        f"head_dim {shape.head_dim}, {shape.num_heads} query / {shape.num_kv_heads} kv heads, "
        f"blocks of {shape.block_size}, {shape.dtype}"
    )
