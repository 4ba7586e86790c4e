"""Triton paged attention kernels: one source for CUDA and ROCm, testable on a CPU.

The kernels read K/V in place from the cache (``[N, B, Hkv, D]`` per layer) through an
int32 block table: no copy of any sequence, no padding to a bucket, no mask tensor.

- ``decode_partition``: one program per (decode row, kv head, partition). The query
  heads that share the kv head are the rows of one tile (``[G, D]``, padded to 16 for
  the matrix units), so each K/V tile is loaded once for the whole group (native GQA).
  A partition is a stretch of the row's positions; with more than one (flash-decoding,
  for batches whose rows x kv heads are too few to fill the GPU) each writes its
  normalized result and its base-2 log-sum-exp, and ``decode_merge`` combines
  them. A partition past the end of a shorter row writes an LSE of -inf and weighs 0.
- ``prefill``: one program per (tile of up to ``BLOCK_M`` new tokens of one chunk, query
  head): the chunk's queries after ``C`` cached tokens see positions ``0..C + i``. Query
  head ``h`` reads kv head ``h // G`` where it lies (the group's other heads find those
  tiles in L2); prefill is compute-bound, so its tile is queries x tokens, not heads.

Online softmax in base 2 (``exp2``, scores pre-multiplied by ``scale * log2(e)``), fp32
accumulators, dot products in the cache's dtype with fp32 accumulation.

With ``TRITON_INTERPRET=1`` set before triton is imported, Triton's interpreter runs
them on CPU tensors (the tests do this, ``tests/engine/triton_interpreter.py``). The
interpreter multiplies bfloat16 operands of ``tl.dot`` wrongly (triton 3.x, numpy has no
bfloat16), so under it ``UPCAST`` makes those dot products fp32: the one difference
between what the tests run and what the GPU runs.
"""

# No ``from __future__ import annotations``: triton.jit reads ``tl.constexpr`` annotations.
import triton
import triton.language as tl

__all__ = ["INTERPRETED", "decode_merge", "decode_partition", "prefill"]


# Not specialized: ints Triton would otherwise compile apart when equal to 1 or divisible
# by 16, and that a step changes (the block table's width, the split count). One compiled
# kernel serves every value; they are a multiplier of one row index, and a mask's bound.
@triton.jit(do_not_specialize=["stride_bt_seq"])
def decode_partition(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    out_ptr,
    scale_log2,
    stride_q_tok,
    stride_q_head,
    stride_c_block,
    stride_c_tok,
    stride_c_head,
    stride_bt_seq,
    stride_o_tok,
    stride_o_head,
    seq_lens_ptr,
    rows_ptr,
    seqs_ptr,
    part_out_ptr,
    part_lse_ptr,
    partition_tokens,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    UPCAST: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    row = tl.load(rows_ptr + r).to(tl.int64)
    seq = tl.load(seqs_ptr + r).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + seq)
    start = split * partition_tokens
    end = tl.minimum(start + partition_tokens, seq_len)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, DIM_PAD)
    n = tl.arange(0, TILE_N)
    heads = kv_head * GROUP + g
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    q_mask = g_ok[:, None] & d_ok[None, :]
    q = tl.load(
        q_ptr + row * stride_q_tok + heads[:, None] * stride_q_head + d[None, :],
        mask=q_mask,
        other=0.0,
    )  # [G, D]
    if UPCAST:
        q = q.to(tl.float32)
    table = block_tables_ptr + seq * stride_bt_seq
    head_offset = kv_head * stride_c_head

    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)  # noqa: E741 (the softmax denominator, as in papers)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
    for tile_start in range(start, end, TILE_N):
        pos = tile_start + n
        ok = pos < end
        block = tl.load(table + pos // BLOCK_SIZE, mask=ok, other=0).to(tl.int64)
        slot = block * stride_c_block + (pos % BLOCK_SIZE) * stride_c_tok + head_offset
        kv_mask = ok[:, None] & d_ok[None, :]
        k = tl.load(k_cache_ptr + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale_log2  # [G, TILE_N]
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))  # finite: every tile holds a position < end
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)  # noqa: E741
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m = m_new

    if NUM_SPLITS == 1:
        out = acc / l[:, None]
        dst = out_ptr + row * stride_o_tok + heads[:, None] * stride_o_head + d[None, :]
        tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        # Partials are [R, Hq, NUM_SPLITS, DIM_PAD] and [R, Hq, NUM_SPLITS], contiguous.
        nonempty = l > 0
        out = acc / tl.where(nonempty, l, 1.0)[:, None]
        lse = tl.where(nonempty, m + tl.log2(tl.where(nonempty, l, 1.0)), float("-inf"))
        cell = (r * (GROUP * tl.num_programs(1)) + heads) * NUM_SPLITS + split  # [G]
        tl.store(part_lse_ptr + cell, lse, mask=g_ok)
        tl.store(part_out_ptr + cell[:, None] * DIM_PAD + d[None, :], out, mask=g_ok[:, None])


@triton.jit(do_not_specialize=["num_splits"])
def decode_merge(
    part_out_ptr,
    part_lse_ptr,
    rows_ptr,
    out_ptr,
    num_splits,
    stride_o_tok,
    stride_o_head,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    row = tl.load(rows_ptr + r).to(tl.int64)
    s = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, DIM_PAD)
    cell = (r * tl.num_programs(1) + head) * NUM_SPLITS + s
    s_ok = s < num_splits
    lse = tl.load(part_lse_ptr + cell, mask=s_ok, other=float("-inf"))
    # Partition 0 always holds a position, so the peak is finite.
    weight = tl.exp2(lse - tl.max(lse, 0))  # [NUM_SPLITS], 0 where empty
    parts = part_out_ptr + cell[:, None] * DIM_PAD + d[None, :]
    part = tl.load(parts, mask=s_ok[:, None], other=0.0)
    out = tl.sum(part * weight[:, None], 0) / tl.sum(weight, 0)
    dst = out_ptr + row * stride_o_tok + head * stride_o_head + d
    tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


@triton.jit(do_not_specialize=["stride_bt_seq"])
def prefill(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    out_ptr,
    scale_log2,
    stride_q_tok,
    stride_q_head,
    stride_c_block,
    stride_c_tok,
    stride_c_head,
    stride_bt_seq,
    stride_o_tok,
    stride_o_head,
    tiles_ptr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE_N: tl.constexpr,
    UPCAST: tl.constexpr,
):
    tile = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    # A tile: [first row in the batch, rows in the tile, position of its first row, sequence]
    first_row = tl.load(tiles_ptr + tile * 4).to(tl.int64)
    num_rows = tl.load(tiles_ptr + tile * 4 + 1)
    first_pos = tl.load(tiles_ptr + tile * 4 + 2)
    seq = tl.load(tiles_ptr + tile * 4 + 3).to(tl.int64)

    i = tl.arange(0, BLOCK_M)
    d = tl.arange(0, DIM_PAD)
    n = tl.arange(0, TILE_N)
    i_ok = i < num_rows
    d_ok = d < HEAD_DIM
    q_mask = i_ok[:, None] & d_ok[None, :]
    rows = first_row + i
    q = tl.load(
        q_ptr + rows[:, None] * stride_q_tok + head * stride_q_head + d[None, :],
        mask=q_mask,
        other=0.0,
    )  # [BLOCK_M, D]
    if UPCAST:
        q = q.to(tl.float32)
    query_pos = first_pos + i
    end = first_pos + num_rows  # the last row sees positions up to end - 1
    table = block_tables_ptr + seq * stride_bt_seq
    head_offset = kv_head * stride_c_head

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)  # noqa: E741
    acc = tl.zeros([BLOCK_M, DIM_PAD], tl.float32)
    for tile_start in range(0, end, TILE_N):
        pos = tile_start + n
        ok = pos < end
        block = tl.load(table + pos // BLOCK_SIZE, mask=ok, other=0).to(tl.int64)
        slot = block * stride_c_block + (pos % BLOCK_SIZE) * stride_c_tok + head_offset
        kv_mask = ok[:, None] & d_ok[None, :]
        k = tl.load(k_cache_ptr + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale_log2  # [BLOCK_M, TILE_N]
        visible = ok[None, :] & (pos[None, :] <= query_pos[:, None])
        s = tl.where(visible, s, float("-inf"))
        # Every row sees position 0 in the first tile, so the running peak is finite.
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)  # noqa: E741
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m = m_new

    out = acc / l[:, None]
    dst = out_ptr + rows[:, None] * stride_o_tok + head * stride_o_head + d[None, :]
    tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=q_mask)


# Interpreted when TRITON_INTERPRET=1 was set before triton was imported: its own
# library (tl.zeros, tl.max, ...) is then interpreted too, so the choice is per process.
INTERPRETED: bool = type(decode_partition).__name__ == "InterpretedFunction"
