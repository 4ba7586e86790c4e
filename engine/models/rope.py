"""Rotary position embeddings (RoPE), with the linear and llama3 frequency scalings.

Each pair of channels ``(i, i + D/2)`` of a head is rotated by ``position * inv_freq[i]``
("rotate half" layout, as in the Hugging Face checkpoints). The inverse frequencies
are computed once, in float32 on the CPU; the angles are computed in float32 per step
from the positions, so no ``[max_positions, D]`` table is ever allocated, and cos/sin
are cast to the model dtype only at the end, as transformers does.
"""

from __future__ import annotations

import math

import torch

from engine.errors import ModelConfigError
from engine.model_config import SUPPORTED_ROPE_TYPES, RopeScaling

__all__ = ["RotaryEmbedding", "apply_rotary", "rope_inv_freq"]


def rope_inv_freq(
    *, head_dim: int, theta: float, scaling: RopeScaling | None
) -> torch.Tensor:  # [D/2] float32, CPU
    """The rotation speed of each channel pair, after any frequency scaling."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    raise ModelConfigError(
        f"rope type {scaling.rope_type!r} is not supported; supported rope types: "
        f"{', '.join(SUPPORTED_ROPE_TYPES)}"
    )


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """Llama 3.1: slow waves divided by ``factor``, fast waves kept, the band between blended."""
    old_context = scaling.original_max_position_embeddings
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    # RopeScaling's __post_init__ requires all three of a llama3 scheme.
    assert old_context is not None and low is not None and high is not None
    low_freq_wavelen = old_context / low
    high_freq_wavelen = old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, blended, scaled)


class RotaryEmbedding:
    """cos/sin of every token's rotation angles; holds no parameters, only ``inv_freq``.

    Deliberately not an ``nn.Module`` buffer: ``model.to(dtype)`` would round the
    frequencies to bfloat16 and meta-device construction would leave them empty.
    The device copy is made on first use on each device and kept.
    """

    __slots__ = ("_inv_freq", "_inv_freq_cpu")

    def __init__(self, *, head_dim: int, theta: float, scaling: RopeScaling | None) -> None:
        self._inv_freq_cpu = rope_inv_freq(head_dim=head_dim, theta=theta, scaling=scaling)
        self._inv_freq = self._inv_freq_cpu

    def __call__(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:  # 2 x [T, D]
        if self._inv_freq.device != positions.device:
            self._inv_freq = self._inv_freq_cpu.to(positions.device)
        angles = positions[:, None].to(torch.float32) * self._inv_freq[None, :]  # [T, D/2]
        angles = torch.cat((angles, angles), dim=-1)  # [T, D]
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(
    x: torch.Tensor,  # [T, H, D]
    cos: torch.Tensor,  # [T, D]
    sin: torch.Tensor,  # [T, D]
) -> torch.Tensor:  # [T, H, D]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # [T, H, D]
    return x * cos[:, None, :] + rotated * sin[:, None, :]
