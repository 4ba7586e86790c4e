"""Choosing an attention backend by name for a device.

- ``"reference"``: ``ReferenceAttention``, the slow, plain-torch oracle.
- ``"paged"``: ``PagedAttention``, split-KV: decodes in staged tiles batched across
  sequences, prefill over zero-copy runs; the fast CPU path (correct anywhere).
- ``"gather"``: ``GatherAttention``, gather-then-SDPA; the GPU path.
- ``"fast"`` and ``"auto"``: the best of those for the device: ``paged`` on CPU,
  ``gather`` on CUDA/ROCm and anything else (its ops are device-agnostic torch).
"""

from __future__ import annotations

import torch

from engine.attention.backend import AttentionBackend
from engine.attention.gather import GatherAttention
from engine.attention.paged import PagedAttention
from engine.attention.reference import ReferenceAttention
from engine.device import resolve_device
from engine.errors import InvalidRequestError

__all__ = ["ATTENTION_BACKENDS", "get_attention_backend"]

ATTENTION_BACKENDS = ("auto", "fast", "gather", "paged", "reference")


def get_attention_backend(name: str = "auto", *, device: str | torch.device) -> AttentionBackend:
    """A new backend instance (backends keep per-step plans, so share one per model)."""
    if name not in ATTENTION_BACKENDS:
        raise InvalidRequestError(
            f"unknown attention backend {name!r}; choose one of {', '.join(ATTENTION_BACKENDS)}"
        )
    if name in ("auto", "fast"):
        name = "paged" if resolve_device(device).type == "cpu" else "gather"
    if name == "paged":
        return PagedAttention()
    if name == "gather":
        return GatherAttention()
    return ReferenceAttention()
