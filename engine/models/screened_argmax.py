"""Greedy tokens on a CPU without the full float32 logits GEMM: screen, then compute exactly.

On a CPU the output projection dominates a decode step of a model with a large
vocabulary (a 100k x 256 head: ~5 ms of a ~10 ms step for 8 rows on two cores), and its
read of the weight is what costs: 100 MB in float32 every step. A greedy row needs only
the argmax, so:

1. screen: approximate logits ``a`` from a low-precision copy of the weight: int8
   (``engine.models.int8_screen``, 26 MB) where the CPU has int8 dot-product units,
   else bfloat16 (51 MB) on the CPU's bfloat16 units (AMX or AVX512-BF16 through
   oneDNN);
2. bound: every ``|a_v - e_v|`` is at most ``B + U |a_v|`` (``e``: the float32 logits;
   ``B`` from the rounding of the weight and the hidden state, and of both sums; ``U``
   from the screen's output), so only tokens with ``a_v + U |a_v| >= max(a) - U |max(a)|
   - 2B`` can hold the largest ``e_v``;
3. compute the float32 logits of those candidates alone (for 8 rows of
   ``tiny-random``: a median of 9 of 100,277 through bfloat16, 85 through int8)
   and take their argmax, ties to the lowest token id, as ``torch.argmax`` does.

The candidates always include the float32 argmax, so the token is the one the full
float32 logits give, up to the float rounding any two GEMM kernels differ by (another
summation order, as ``PackedLinear`` already accepts). For bfloat16, ``B`` uses
Cauchy-Schwarz per row and the largest row norm of the weight (rounding it to bfloat16
moves each element by at most 2^-8 of itself), doubled to cover the rounding of the
norms themselves; oneDNN accumulates bfloat16 products in float32 on every ISA.

Applies to float32 CPU weights where oneDNN packs the screen's weights and the CPU has
the units for one of them; elsewhere (GPUs, bfloat16 models, other CPUs) ``__call__``
returns ``None`` and the caller computes the full logits. Also ``None`` when the screen
keeps more than an eighth of a large vocabulary (then the full GEMM is the cheaper way)
and for hidden states with NaN or inf. The screen's copy is made on the first call for
each weight version (a quarter of the weight's memory in int8, half in bfloat16; for
the 100k x 256 head, one thread on a busy 2-core host: 0.63-0.66 s in int8, 1.0-1.1 s in
bfloat16).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from engine.models.int8_screen import OUTPUT_ERROR as INT8_OUTPUT_ERROR
from engine.models.int8_screen import Int8Screen, int8_screen_works
from engine.models.packed_linear import onednn_packing_works

__all__ = ["ScreenedArgmax", "fast_bf16_matmul"]

_BATCH_HINT = 64  # as in packed_linear: one packing serves 1 to 64 rows
_GROUP = 8  # the screen's groups: 8 tokens, 128 apart (a vectorized reduction)
_LANES = 128
_PAD = _GROUP * _LANES
_U_BF16 = 2.0**-7  # |x - bf16(x)| <= 2^-7 |bf16(x)| under any rounding mode
_U_BF16_RNE = 2.0**-8  # |x - bf16(x)| <= 2^-8 |x| rounding to nearest, as torch converts
_U_F32 = 2.0**-24
_SLACK = 2.0**-20  # relative: the threshold's rounding to the screen's float32
_MIN_CAP = 2048  # candidates are always cheap below this many


@functools.cache
def fast_bf16_matmul() -> bool:
    """Whether oneDNN multiplies bfloat16 here on the CPU's own bfloat16 units."""
    if not onednn_packing_works():
        return False
    cpu = getattr(torch, "cpu", None)
    has_units = any(
        bool(getattr(cpu, probe, lambda: False)())
        for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    )
    if not has_units:
        return False
    try:
        generator = torch.Generator().manual_seed(0)
        weight = torch.randn(64, 32, generator=generator).bfloat16()
        x = torch.randn(3, 32, generator=generator).bfloat16()
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, _BATCH_HINT)
        out = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    want = F.linear(x.float(), weight.float())
    return out.dtype == torch.bfloat16 and torch.allclose(out.float(), want, rtol=2**-7, atol=1e-6)


class _Screen:
    """The bfloat16 copy of one weight version and its error constants."""

    __slots__ = ("max_row_norm", "max_row_norm_bf16", "num_tokens", "packed", "row_error")

    def __init__(self, weight: torch.Tensor) -> None:  # [V, H] float32
        num_tokens, hidden = weight.shape
        padded = torch.zeros(-(-num_tokens // _PAD) * _PAD, hidden, dtype=torch.bfloat16)
        # Converted in the weight's own layout, then transposed: half the bytes to move.
        padded[:num_tokens] = weight.to(torch.bfloat16)  # padding screens as 0; ids clamped
        self.packed = torch.ops.mkldnn._reorder_linear_weight(padded, _BATCH_HINT)
        # Rounding to nearest moves each element by at most 2^-8 of itself, so one pass
        # over the float32 rows bounds all three norms (a float32 norm is off by ~1e-6
        # relative; the bound's factor 2 covers it).
        norm = float(torch.linalg.vector_norm(weight, dim=1).max())
        self.max_row_norm = norm
        self.row_error = _U_BF16_RNE * norm  # max ||W_v - bf16(W_v)||
        self.max_row_norm_bf16 = (1 + _U_BF16_RNE) * norm
        self.num_tokens = num_tokens


class ScreenedArgmax:
    """``argmax(hidden @ weight.T, dim=-1)`` for float32 CPU tensors, or ``None``.

    ``kind``: which screen reads the vocabulary: ``"auto"`` (int8 where
    ``int8_screen_works``, else bfloat16), ``"int8"`` or ``"bfloat16"``.
    ``require_fast_units=False`` runs a screen on a CPU without the units that make it
    fast (for tests: the same tokens, slower)."""

    __slots__ = ("_group_ids", "_kind", "_screen", "_source", "_version")

    def __init__(self, *, kind: str = "auto") -> None:
        if kind not in ("auto", "int8", "bfloat16"):
            raise ValueError(f"kind must be 'auto', 'int8' or 'bfloat16', got {kind!r}")
        self._kind = kind
        self._screen: _Screen | Int8Screen | None = None
        self._group_ids = torch.zeros(0, _GROUP, dtype=torch.int64)
        self._source: torch.Tensor | None = None
        self._version = -1

    def __call__(
        self,
        hidden: torch.Tensor,  # [S, H]
        weight: torch.Tensor,  # [V, H], any strides
        *,
        require_fast_units: bool = True,
    ) -> torch.Tensor | None:  # [S] int64
        usable = (
            hidden.device.type == "cpu"
            and weight.device.type == "cpu"
            and hidden.dtype == weight.dtype == torch.float32
            and hidden.dim() == 2
            and self._works(require_fast_units)
        )
        if not usable:
            return None
        screen = self._screen
        if screen is None or self._source is not weight or self._version != weight._version:
            screen = self._screen = self._build(weight, require_fast_units)
            self._source, self._version = weight, weight._version
            padded = -(-screen.num_tokens // _PAD) * _PAD
            self._group_ids = _group_ids(padded, screen.num_tokens)
        ids = _candidates(hidden, screen, self._group_ids)
        if ids is None:
            return None
        exact = F.linear(hidden, weight.index_select(0, ids))  # [S, n] float32
        return ids.index_select(0, exact.argmax(dim=-1))

    def _works(self, fast: bool) -> bool:
        return self._int8(fast) or (
            self._kind != "int8" and (fast_bf16_matmul() if fast else onednn_packing_works())
        )

    def _int8(self, fast: bool) -> bool:
        return self._kind != "bfloat16" and int8_screen_works(require_units=fast)

    def _build(self, weight: torch.Tensor, fast: bool) -> _Screen | Int8Screen:
        # Int8 where it applies: it reads half the bytes of bfloat16.
        return Int8Screen(weight, pad=_PAD) if self._int8(fast) else _Screen(weight)


def _candidates(
    hidden: torch.Tensor, screen: _Screen | Int8Screen, group_ids: torch.Tensor
) -> torch.Tensor | None:
    """The token ids that may hold a row's largest float32 logit, ascending ([n]).
    ``group_ids`` ([Vp / 8, 8]): the tokens of each group, the padding clamped to the
    last token (``_group_ids``)."""
    rows = hidden.shape[0]
    if isinstance(screen, Int8Screen):
        screened = screen.logits(hidden)
        if screened is None:
            return None  # a row with NaN or inf: the full logits decide
        approx, bound = screened  # [S, Vp] float32, [S]
        unit = INT8_OUTPUT_ERROR
    else:
        hidden_bf16 = hidden.to(torch.bfloat16)
        approx = torch.ops.mkldnn._linear_pointwise(
            hidden_bf16, screen.packed, None, "none", [], ""
        )  # [S, Vp] bfloat16
        bound = _bound(hidden, hidden_bf16, screen)
        unit = _U_BF16
    # Group g of block b holds tokens b * 1024 + g + 128 * i, i < 8: the max over i is a
    # reduction across contiguous 128-lane rows, vectorized, unlike a max per 128 tokens.
    groups = approx.view(rows, -1, _GROUP, _LANES).amax(dim=2)  # [S, Vp / 1024, 128]
    # A few numbers per row: worked out in Python (float64), not in ~15 tensor ops.
    row_max = groups.view(rows, -1).amax(dim=1).tolist()
    least = [_threshold(m, b, unit) for m, b in zip(row_max, bound.tolist(), strict=True)]
    if approx.dtype == torch.bfloat16:
        # Compared in bfloat16, so no float32 copy of the screen is made: lowered by
        # 2^-7 |t| first, so that rounding to nearest (half a step, <= 2^-8 |t|) cannot
        # raise it above t.
        least = [t - _U_BF16 * abs(t) for t in least]
    if not all(math.isfinite(t) for t in least):
        return None  # a row with NaN or inf: the full logits decide, as they always did
    threshold = torch.tensor(least, dtype=approx.dtype)  # rounded to nearest: the slack
    hits = (groups >= threshold[:, None, None]).any(dim=0).flatten().nonzero()  # [n, 1]
    cap = max(screen.num_tokens // 8, _MIN_CAP)  # past it, the full GEMM is cheaper
    if hits.shape[0] > cap:
        return None  # a wide screen: even its groups are too many to test one by one
    ids = group_ids[hits[:, 0]].flatten()  # ascending; padding repeats the last token
    # A group that holds a candidate holds 7 tokens that are mostly not: tested one by
    # one, they leave the exact pass a tenth of the rows or less.
    keep = (approx.index_select(1, ids) >= threshold[:, None]).any(dim=0)  # [n]
    ids = ids[keep]
    return None if ids.numel() > cap else ids


def _group_ids(padded: int, num_tokens: int) -> torch.Tensor:  # [padded / 8, 8] int64
    """Row ``b * 128 + lane``: the tokens of group ``lane`` of block ``b``, ascending."""
    blocks = torch.arange(0, padded, _PAD)[:, None, None]
    lanes = torch.arange(_LANES)[None, :, None]
    ids = blocks + lanes + torch.arange(0, _PAD, _LANES)[None, None, :]  # [B, 128, 8]
    return ids.clamp_(max=num_tokens - 1).view(-1, _GROUP)


def _bound(hidden: torch.Tensor, hidden_bf16: torch.Tensor, screen: _Screen) -> torch.Tensor:
    """``B`` per row ([S]): |screened logit before its bfloat16 output - float32 logit|."""
    rounded = hidden_bf16.float()
    norm = hidden.norm(dim=1)
    norm_bf16 = rounded.norm(dim=1)
    rounding = (hidden - rounded).norm(dim=1)
    terms = hidden.shape[1]
    gamma = terms * _U_F32 / (1 - terms * _U_F32)  # any summation order, either GEMM
    bound = (
        screen.row_error * norm  # (W - bf16(W)) . h
        + screen.max_row_norm_bf16 * rounding  # bf16(W) . (h - bf16(h))
        + gamma * (screen.max_row_norm_bf16 * norm_bf16 + screen.max_row_norm * norm)
    )
    return 2 * bound + 1e-30


def _threshold(row_max: float, bound: float, unit: float) -> float:
    """The least screened logit a candidate can have (x + U|x| >= m - U|m| - 2B, ``U``:
    ``unit``, the screen's relative output error), or just below it."""
    least = row_max - unit * abs(row_max) - 2 * bound
    threshold = least / (1 + unit) if least >= 0 else least / (1 - unit)
    return threshold - _SLACK * (abs(threshold) + abs(row_max))
