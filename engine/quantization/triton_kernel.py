"""The Triton source of the dequantize-and-multiply kernel (imported only with Triton).

``y[M, N] = x[M, K] @ (codes[N, K] * scales[N, K // G]).T``, one program per
``BLOCK_M x BLOCK_N`` tile of ``y`` and K range, walking its range in ``BLOCK_K`` steps
that never straddle a group (``BLOCK_K`` divides ``G``), so each step multiplies by one
scale per row. Unsplit (one range, the whole of K), a program stores its tile of ``y`` in
the output's dtype; split (``split_k`` ranges of ``k_per_split`` columns, whole groups,
the last one shorter), program ``(m, n, s)`` stores its float32 partial sums in slice
``s`` of a ``[splits, M, N]`` workspace, which the launcher sums. int4
bytes hold columns 2j (low nibble) and 2j + 1 (high nibble): rather than interleave the
two nibble planes in registers, the even and odd columns of ``x`` are loaded apart and
each plane gets its own ``tl.dot``. Accumulates in float32; the codes never leave
registers in the model dtype. ``DOT_FP32`` multiplies the tiles in float32 instead: the
launcher sets it for bfloat16 under the interpreter, whose ``tl.dot`` returns garbage for
bfloat16 operands (Triton 3.9: errors of 1e10 on a 16 x 16 product).

Kept apart from its launcher (``triton_matmul``) because ``tl.constexpr`` annotations
must resolve when the function is defined, and the rest of the engine imports without
Triton. The body is decorated with ``triton.jit`` at first use, so ``TRITON_INTERPRET=1``
set before that (the tests do) runs it under Triton's interpreter on CPU tensors.
"""

import functools

import triton
import triton.language as tl

__all__ = ["dequant_matmul_kernel"]


def _dequant_matmul(
    x_ptr,
    q_ptr,
    s_ptr,
    y_ptr,
    M,
    N,
    K,
    k_per_split,
    stride_xm,
    stride_qn,
    stride_sn,
    stride_ym,
    GROUP: tl.constexpr,
    INT4: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = rm < M
    mask_n = rn < N
    x_dtype = tl.float32 if DOT_FP32 else x_ptr.dtype.element_ty
    # tl.full, not tl.zeros: zeros is itself a jitted helper, which the interpreter can
    # only call when Triton was imported with TRITON_INTERPRET=1 already set.
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, dtype=tl.float32)
    if INT4:
        HALF: tl.constexpr = BLOCK_K // 2
        rb = tl.arange(0, HALF)
        for k0 in range(k_start, k_end, BLOCK_K):
            scale = tl.load(s_ptr + rn * stride_sn + k0 // GROUP, mask=mask_n, other=0.0)
            scale = scale.to(tl.float32)[:, None]  # [BN, 1]
            packed = tl.load(
                q_ptr + rn[:, None] * stride_qn + (k0 // 2 + rb)[None, :],
                mask=mask_n[:, None],
                other=0,
            ).to(tl.int32)  # [BN, HALF]
            low = (((packed & 15) - 8).to(tl.float32) * scale).to(x_dtype)
            high = (((packed >> 4) - 8).to(tl.float32) * scale).to(x_dtype)
            x_rows = x_ptr + rm[:, None] * stride_xm + (k0 + 2 * rb)[None, :]
            x_even = tl.load(x_rows, mask=mask_m[:, None], other=0.0).to(x_dtype)  # [BM, HALF]
            x_odd = tl.load(x_rows + 1, mask=mask_m[:, None], other=0.0).to(x_dtype)
            acc += tl.dot(x_even, tl.trans(low))
            acc += tl.dot(x_odd, tl.trans(high))
    else:
        rk = tl.arange(0, BLOCK_K)
        for k0 in range(k_start, k_end, BLOCK_K):
            scale = tl.load(s_ptr + rn * stride_sn + k0 // GROUP, mask=mask_n, other=0.0)
            codes = tl.load(
                q_ptr + rn[:, None] * stride_qn + (k0 + rk)[None, :],
                mask=mask_n[:, None],
                other=0,
            )  # [BN, BK] int8
            w = (codes.to(tl.float32) * scale.to(tl.float32)[:, None]).to(x_dtype)
            x = tl.load(
                x_ptr + rm[:, None] * stride_xm + (k0 + rk)[None, :],
                mask=mask_m[:, None],
                other=0.0,
            ).to(x_dtype)  # [BM, BK]
            acc += tl.dot(x, tl.trans(w))
    # Slice pid_k of the workspace (0: the output itself, unsplit); int64, as the
    # workspace may pass 2^31 elements where the output does not.
    y = y_ptr + pid_k.to(tl.int64) * M * stride_ym + rm[:, None] * stride_ym + rn[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@functools.cache
def dequant_matmul_kernel():  # the jitted (or, under TRITON_INTERPRET=1, interpreted) kernel
    # M, the batch's rows, is not specialized: Triton would compile a kernel for M == 1
    # (a decode of one sequence) apart from the rest, and one for M divisible by 16, in
    # the middle of serving. It bounds a mask and strides the workspace only.
    # The split count is no constexpr, nor an argument: the grid's third dimension and
    # k_per_split (a whole number of groups, so always a multiple of 16, one
    # specialization) carry it. As a constexpr each count, which the batch's rows decide,
    # would compile a kernel of its own, some first mid-serving; as it is, every split
    # count runs one kernel, which differs from the unsplit one in y_ptr's dtype
    # (float32 partial sums) and which the startup probe compiles (``triton_probe``).
    return triton.jit(do_not_specialize=["M"])(_dequant_matmul)
