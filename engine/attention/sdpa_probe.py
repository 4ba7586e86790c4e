"""Which fused SDPA kernels this device and torch build can run, found at startup.

A fused kernel that cannot run makes torch fall back, silently, to the math kernel,
which materializes every score: on a 16 GB card a long prefill chunk then runs out of
memory where a fused kernel needs almost nothing. So the engine asks once per device:

- on ROCm, the architecture (``gcnArchName``). AOTriton, ROCm's fused kernels, treats
  RDNA3 and RDNA4 (gfx11xx, gfx12xx) as experimental and leaves them off unless
  ``TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1``; torch reads it once, at the first
  attention call, so the probe sets it (unless the user set it, to anything) before its
  own first call, and says so;
- each fused kernel (``FLASH``, then ``EFFICIENT``) is run on a tiny problem and its
  output and log-sum-exp compared with plain math: a kernel that raises or differs is
  not used.

What it finds is logged once at INFO. Where no fused kernel runs, the SDPA path uses
the math kernel tiled over query rows (``sdpa_lse``), within ``math_budget_bytes``.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass

import torch

from engine.attention.sdpa_lse import SdpaKernel, attend_lse
from engine.attention.torch_features import flash_cpu_op, sdpa_enable_gqa

__all__ = [
    "EXPERIMENTAL_ENV",
    "SdpaSupport",
    "aotriton_experimental",
    "decide_support",
    "probe_sdpa",
]

logger = logging.getLogger(__name__)

EXPERIMENTAL_ENV = "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"
_MIB = 1 << 20


def aotriton_experimental(arch: str) -> bool:
    """Whether AOTriton gates its kernels on ``arch`` behind ``EXPERIMENTAL_ENV``: the
    consumer RDNA3 and RDNA4 cards (gfx11xx, gfx12xx), not CDNA (gfx9xx)."""
    return arch.split(":")[0].startswith(("gfx11", "gfx12"))


@dataclass(frozen=True, slots=True)
class SdpaSupport:
    device: str
    arch: str  # "cpu", "sm90", "gfx1201"
    kernels: tuple[SdpaKernel, ...]  # the fused kernels that ran and agreed, best first
    gqa: bool  # F.scaled_dot_product_attention takes enable_gqa
    set_experimental: bool  # this process set EXPERIMENTAL_ENV for AOTriton
    math_budget_bytes: int = 256 * _MIB

    def kernel_for(self, dtype: torch.dtype, head_dim: int) -> SdpaKernel:
        """The kernel for partial attention on these inputs: the best fused one that
        takes them (flash: half precision, head_dim <= 256, a multiple of 8; efficient:
        a multiple of 8, or 4 in float32), else tiled math."""
        half = dtype in (torch.float16, torch.bfloat16)
        for kernel in self.kernels:
            if kernel is SdpaKernel.CPU:
                return kernel
            if kernel is SdpaKernel.FLASH and half and head_dim <= 256 and head_dim % 8 == 0:
                return kernel
            if kernel is SdpaKernel.EFFICIENT and head_dim % (8 if half else 4) == 0:
                return kernel
        return SdpaKernel.MATH

    def describe(self) -> str:
        fused = ", ".join(k.value for k in self.kernels) or "none (math, tiled)"
        text = f"SDPA on {self.device} ({self.arch}): fused kernels {fused}"
        if self.set_experimental:
            text += f"; set {EXPERIMENTAL_ENV}=1 (AOTriton calls {self.arch} experimental)"
        return text


@functools.cache
def probe_sdpa(device: torch.device) -> SdpaSupport:
    """Probe once per device (cached for the process)."""
    if device.type == "cpu":
        kernels = (SdpaKernel.CPU,) if flash_cpu_op() is not None else ()
        support = SdpaSupport("cpu", "cpu", kernels, sdpa_enable_gqa(), set_experimental=False)
    elif device.type == "cuda":
        support = _probe_gpu(device)
    else:
        support = SdpaSupport(str(device), device.type, (), False, set_experimental=False)
    logger.info(support.describe())
    return support


def _probe_gpu(device: torch.device) -> SdpaSupport:
    props = torch.cuda.get_device_properties(device)
    hip = bool(torch.version.hip)
    arch = props.gcnArchName.split(":")[0] if hip else f"sm{props.major}{props.minor}"
    return decide_support(
        device=str(device),
        arch=arch,
        hip=hip,
        environ=os.environ,
        runs=lambda kernel: _runs(kernel, device),
        gqa=sdpa_enable_gqa(),
    )


def decide_support(
    *,
    device: str,
    arch: str,
    hip: bool,
    environ: MutableMapping[str, str],
    runs: Callable[[SdpaKernel], bool],
    gqa: bool,
) -> SdpaSupport:
    """The GPU probe's decisions, given how to try a kernel (``runs``)."""
    set_experimental = False
    if hip and aotriton_experimental(arch) and EXPERIMENTAL_ENV not in environ:
        environ[EXPERIMENTAL_ENV] = "1"  # before any kernel runs: torch reads it once
        set_experimental = True
    kernels = tuple(k for k in (SdpaKernel.FLASH, SdpaKernel.EFFICIENT) if runs(k))
    support = SdpaSupport(device, arch, kernels, gqa, set_experimental)
    if not kernels and hip and aotriton_experimental(arch):
        logger.warning(
            "no fused SDPA kernel runs on %s (%s): attention falls back to tiled math. "
            "If %s=%s was set after the first attention call of this process, set it "
            "before starting it.",
            device,
            arch,
            EXPERIMENTAL_ENV,
            environ.get(EXPERIMENTAL_ENV),
        )
    return support


def _runs(kernel: SdpaKernel, device: torch.device) -> bool:
    gen = torch.Generator().manual_seed(0)
    # The shapes the engine uses: 2 sequences' worth of heads, head_dim 64, half precision.
    q, k, v = (torch.randn(1, 2, n, 64, generator=gen) for n in (5, 9, 9))
    want, want_lse = attend_lse(q, k, v, scale=0.125, causal=False, kernel=SdpaKernel.MATH)
    half = torch.float16
    try:
        out, lse = attend_lse(
            *(t.to(device, half) for t in (q, k, v)), scale=0.125, causal=False, kernel=kernel
        )
    except RuntimeError as exc:  # "no kernel image", "not compiled for this arch", ...
        logger.debug("SDPA %s kernel does not run on %s: %s", kernel.value, device, exc)
        return False
    return bool(
        torch.allclose(out.float().cpu(), want, atol=1e-2)
        and torch.allclose(lse.cpu(), want_lse, atol=1e-2)
    )
