"""Choosing an attention backend by name for a device.

- ``"reference"``: ``ReferenceAttention``, the slow, plain-torch oracle.
- ``"paged"``: ``PagedAttention``, split-KV: decodes in staged tiles batched across
  sequences, prefill over zero-copy runs; the fast CPU path (correct anywhere).
- ``"gather"``: ``GatherAttention``, gather-then-SDPA; the GPU path where triton is
  absent.
- ``"triton"``: ``TritonAttention``, kernels that read the paged cache in place; the GPU
  path (CUDA and ROCm). On CPU tensors it runs only under Triton's interpreter (tests).
- ``"fast"`` and ``"auto"``: the best of those for the device (``resolve_name``):
  ``paged`` on CPU; ``triton`` on CUDA/ROCm where triton imports and its kernels run
  for the model's ``AttentionShape`` (``triton_probe``), else ``gather``; ``gather`` on
  anything else (its ops are device-agnostic torch).
"""

from __future__ import annotations

import torch

from engine.attention.backend import AttentionBackend
from engine.attention.gather import GatherAttention
from engine.attention.paged import PagedAttention
from engine.attention.reference import ReferenceAttention
from engine.attention.sdpa_probe import probe_sdpa
from engine.attention.shape import AttentionShape
from engine.attention.triton_attention import TritonAttention, triton_available
from engine.attention.triton_probe import triton_runs_on
from engine.device import default_dtype, resolve_device
from engine.errors import InvalidRequestError

__all__ = ["ATTENTION_BACKENDS", "get_attention_backend", "resolve_name"]

ATTENTION_BACKENDS = ("auto", "fast", "gather", "paged", "reference", "triton")


def resolve_name(name: str, *, device_type: str, has_triton: bool) -> str:
    """The backend ``name`` stands for on a device of ``device_type``."""
    if name not in ATTENTION_BACKENDS:
        raise InvalidRequestError(
            f"unknown attention backend {name!r}; choose one of {', '.join(ATTENTION_BACKENDS)}"
        )
    if name == "triton" and not has_triton:
        raise InvalidRequestError(
            "attention='triton' needs the triton package (GPU builds of torch ship it; "
            "pip install 'kvgov[triton]'), or choose attention='auto'"
        )
    if name not in ("auto", "fast"):
        return name
    if device_type == "cpu":
        return "paged"
    if device_type == "cuda" and has_triton:  # ROCm is torch.cuda too
        return "triton"
    return "gather"


def get_attention_backend(
    name: str = "auto", *, device: str | torch.device, shape: AttentionShape | None = None
) -> AttentionBackend:
    """A new backend instance (backends keep per-step plans, so share one per model).
    ``shape``: the model's, which ``auto`` probes the Triton kernels with on a GPU;
    ``None`` probes a small one (head_dim 64, 4 query and 2 kv heads, in the device's
    default dtype)."""
    resolved = resolve_device(device)
    device_type = resolved.type
    # At startup, before the model's first attention call: the probe logs the fused
    # kernels and may set AOTriton's switch, which torch reads at that first call.
    probe_sdpa(resolved)
    # Only the names that may mean triton look for it: importing it takes a while. For
    # auto, it must also compile and run here (triton_probe); asked for by name, it is
    # used as it is, and fails loudly.
    wants = name == "triton" or (name in ("auto", "fast") and device_type == "cuda")
    has_triton = wants and triton_available()
    if has_triton and name != "triton":
        if shape is None:
            shape = AttentionShape(
                num_heads=4,
                num_kv_heads=2,
                head_dim=64,
                block_size=16,
                dtype=default_dtype(resolved),
            )
        has_triton = triton_runs_on(resolved, shape)
    chosen = resolve_name(name, device_type=device_type, has_triton=has_triton)
    if chosen == "paged":
        return PagedAttention()
    if chosen == "gather":
        return GatherAttention()
    if chosen == "triton":
        return TritonAttention()
    return ReferenceAttention()
