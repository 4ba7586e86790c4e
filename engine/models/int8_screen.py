"""The greedy head's int8 screen: half the bytes of the bfloat16 screen per decode step.

A greedy step on a CPU reads the whole output projection once to find each row's
largest logit (``screened_argmax``). For a 100k x 256 head that read dominates the
step, and it is bound by memory bandwidth, not arithmetic: the bfloat16 screen streams
51 MB a step, this one 26 MB (int8 weights, one float32 scale per token), through
oneDNN's u8 x s8 matmul (AMX or VNNI). Side by side on a loaded 2-core host, one thread:
the greedy head of 8 rows took 6.6-6.9 ms instead of 9.4-10.1 ms.

The screen keeps more candidates than the bfloat16 one (for the 64 greedy steps of 8
rows of ``tiny-random`` in ``kvgov bench engine``: a median of 85 of 100,277, 18-969,
against 9, 8-66), which the exact float32 pass then settles, so the token is the float32
argmax all the same. The bound, per row ``h`` of the step:

- each row is scaled by ``1 / max|h|`` before it is rounded to int8 (a shared
  activation scale would cost the small rows their precision; the argmax of a row does
  not change when the row is scaled), so ``h^ = max|h| (q - 128) / 127``;
- weight row ``W_v`` is rounded to ``W^_v = s_v p_v`` (``p_v`` int8, ``s_v`` its float32
  scale, ``max|W_v| / 127``);
- the int32 sums are exact; the output's float32 scaling moves it by at most a few
  units in the last place (``_U_OUT`` relative, with a wide margin);
- ``|h . W_v - h^ . W^_v| <= ||h - h^|| N + ||h^|| R`` (Cauchy-Schwarz), with ``N`` the
  largest ``||W_v||`` and ``R`` the largest ``||W_v - W^_v||``, plus the float32 GEMM's own
  rounding (``gamma N ||h||``), doubled to cover the rounding of the norms themselves.

Used where oneDNN's quantized linear ops exist, agree with a float64 reference on a
probe, and the CPU has int8 dot-product units (VNNI or AMX); elsewhere the bfloat16
screen or the full logits serve.
"""

from __future__ import annotations

import functools
import math

import torch

__all__ = ["Int8Screen", "int8_screen_works"]

_U_OUT = 2.0**-20  # the output's float32 scaling: a few ulps (2^-24 each), bounded wide
_U_F32 = 2.0**-24
_CHUNK = 1024  # rows per pass when building: temporaries that stay in the CPU's caches
_BATCH_HINT = 64  # the rows oneDNN packs for; 1 to 64 rows run as fast here


def _int8_units() -> bool:
    cpu = getattr(torch, "cpu", None)
    probes = ("_is_vnni_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, probe, lambda: False)()) for probe in probes)


@functools.cache
def int8_screen_works(*, require_units: bool = True) -> bool:
    """Whether oneDNN's u8 x s8 linear runs here (on int8 units, unless not
    ``require_units``) and gets a probe right."""
    if require_units and not _int8_units():
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        generator = torch.Generator().manual_seed(0)
        weight = torch.randint(-127, 128, (40, 24), generator=generator, dtype=torch.int8)
        scales = torch.rand(40, generator=generator, dtype=torch.float32) + 0.5
        rows = torch.randint(0, 256, (3, 24), generator=generator, dtype=torch.uint8)
        out = _matmul(rows, torch.ops.onednn.qlinear_prepack(weight, None), scales)
    except (AttributeError, RuntimeError, NotImplementedError, TypeError):
        return False
    want = ((rows.double() - 128) / 127) @ (weight.double() * scales.double()[:, None]).t()
    close = (out.double() - want).abs() <= _U_OUT * want.abs() + 1e-30
    return out.dtype == torch.float32 and out.shape == want.shape and bool(close.all())


def _matmul(
    rows: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor | None = None,  # [V] int64 zeros
) -> torch.Tensor:
    """``((rows - 128) / 127) @ (p * s).T`` in float32: [S, K] u8 by the packed [V, K]."""
    if zero_points is None:
        zero_points = torch.zeros(scales.shape[0], dtype=torch.int64)
    # The op takes its arguments by position only.
    return torch.ops.onednn.qlinear_pointwise(
        rows,
        1 / 127,  # the rows' scale
        128,  # and zero point
        packed,
        scales,
        zero_points,
        None,  # bias
        1.0,  # output scale
        0,  # output zero point
        torch.float32,
        "none",  # no fused post-op, so no post-op arguments or algorithm
        [],
        "",
    )


class Int8Screen:
    """The int8 copy of one weight version ([V, H] float32, padded to ``pad`` rows with
    zeros) and its error constants."""

    __slots__ = (
        "_bound_weights",
        "_zero_points",
        "max_row_error",
        "max_row_norm",
        "num_tokens",
        "packed",
        "scales",
    )

    def __init__(self, weight: torch.Tensor, *, pad: int) -> None:
        num_tokens, hidden = weight.shape
        padded = -(-num_tokens // pad) * pad
        quantized = torch.zeros(padded, hidden, dtype=torch.int8)
        self.scales = torch.ones(padded, dtype=torch.float32)
        max_norm = max_error = 0.0
        for start in range(0, num_tokens, _CHUNK):
            rows = weight[start : start + _CHUNK].to(torch.float32)  # [C, H]
            end = start + rows.shape[0]
            scale = rows.abs().amax(dim=1).div_(127)
            scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # [C]
            units = rows / scale[:, None]  # in [-127, 127]
            q = torch.round(units)
            # ||W_v - s_v q_v|| = s_v ||units - q||, up to float32 rounding that the
            # bound's factor 2 covers; a pass fewer than forming s_v q_v.
            error = torch.linalg.vector_norm(units.sub_(q), dim=1).mul_(scale).max()
            quantized[start:end] = q.clamp_(-127, 127)
            self.scales[start:end] = scale
            max_error = max(max_error, float(error))
            max_norm = max(max_norm, float(torch.linalg.vector_norm(rows, dim=1).max()))
        self.packed = torch.ops.onednn.qlinear_prepack(quantized, [_BATCH_HINT, hidden])
        self.max_row_norm = max_norm
        self.max_row_error = max_error
        self.num_tokens = num_tokens
        self._zero_points = torch.zeros(padded, dtype=torch.int64)
        gamma = hidden * _U_F32 / (1 - hidden * _U_F32)
        # 2 (||h - h^|| N + ||h^|| R + gamma ||h|| N): one product with the three norms.
        self._bound_weights = torch.tensor(
            [2 * max_norm, 2 * max_error, 2 * gamma * max_norm], dtype=torch.float32
        )

    def logits(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Screened logits of each row scaled by ``1 / max|h|`` ([S, Vp] float32) and each
        row's bound ``B`` in those units ([S]): ``|logit / max|h| - screened| <= B + U|screened|``
        with ``U = OUTPUT_ERROR``. ``None`` for a row with NaN or inf."""
        peak = hidden.abs().amax(dim=1)  # [S]
        if not math.isfinite(float(peak.sum())):  # NaN or inf (or a sum past float32)
            return None
        peak.masked_fill_(peak == 0, 1.0)
        step = (peak / 127)[:, None]  # [S, 1]
        codes = torch.round(hidden / step).clamp_(-127, 127)  # [S, H]
        rounded = codes * step  # h^
        screened = _matmul(
            codes.add_(128).to(torch.uint8), self.packed, self.scales, self._zero_points
        )
        norms = torch.linalg.vector_norm(torch.stack((hidden - rounded, rounded, hidden)), dim=2)
        bound = self._bound_weights @ norms  # [S], doubled for the norms' own rounding
        return screened, (bound + 1e-30) / peak


OUTPUT_ERROR = _U_OUT
