"""Split-KV paged attention: the fast backend for CPUs (correct on any device).

``prepare`` plans the step once (``step_plan``). Each layer's ``forward`` then writes
the new K/V into their slots and computes, for every query row, partial attention over
disjoint parts of its keys, merged by log-sum-exp:

- decodes: long runs of the cache read in place as strided views cut in chunks, runs
  evenly spaced with one chunk size in one kernel call (``decode_views``); the rest in
  staged tiles of a few MiB of gathered keys, batched across sequences
  (``decode_tiles``). Grouped-query heads are folded into the query axis
  (``[R, Hkv, Hq / Hkv, D]``: a decode sees its whole context, so no mask, and each kv
  head is read once);
- prefill chunks per sequence: long runs of the cache attended in place as zero-copy
  views, fragments gathered.

Cache layout per layer: ``[N, B, Hkv, D]``, contiguous, so slot ``i`` (block ``i // B``,
offset ``i % B``) starts at element ``i * Hkv * D`` of the flat cache.
"""

from __future__ import annotations

import torch

from engine.attention.gathered_keys import Workspace
from engine.attention.metadata import AttentionMetadata
from engine.attention.partial import attend, merge_partials
from engine.attention.reference import write_kv
from engine.attention.step_plan import StepPlan, plan_step
from engine.validation import require_int

__all__ = ["PagedAttention"]

_MIB = 1 << 20


class PagedAttention:
    """Paged attention through staged gathers and zero-copy runs.

    - ``stage_bytes``: K and V bytes a decode tile gathers for one kernel call; small
      enough to stay in the CPU's caches (4 MiB, measured best with a 32 MiB L3; with
      2 MiB of L2 per core and a 300 MiB L3, 1-8 MiB were within noise of each other).
    - ``chunk_tokens``: the most positions of one sequence in one tile row; fewer when
      needed for a tile to hold at least four rows (parallel work for the kernel).
    - ``min_run_tokens``: prefill runs at least this long are attended in place; shorter
      ones are gathered (one kernel call costs about as much as copying ~64 tokens).
    - ``min_view_tokens``: decode runs at least this long are read in place
      (``decode_views``); shorter ones are gathered.
    - ``view_chunk_tokens``: the most tokens of one chunk of a decode view; a run alone in
      its view is cut in at least as many chunks as torch has threads. 512: torch's CPU
      kernel splits the keys in blocks of 512 anyway, so smaller chunks cost it little,
      and runs of many lengths cut to one chunk size share a view (one kernel call).
    """

    name = "paged"

    __slots__ = (
        "_chunk_tokens",
        "_metadata",
        "_min_run_tokens",
        "_min_view_tokens",
        "_plan",
        "_stage_bytes",
        "_token_bytes",
        "_view_chunk_tokens",
        "_workspace",
    )

    def __init__(
        self,
        *,
        stage_bytes: int = 4 * _MIB,
        chunk_tokens: int = 2048,
        min_run_tokens: int = 128,
        min_view_tokens: int = 512,
        view_chunk_tokens: int = 512,
    ) -> None:
        self._stage_bytes = require_int("stage_bytes", stage_bytes, minimum=1)
        self._chunk_tokens = require_int("chunk_tokens", chunk_tokens, minimum=1)
        self._min_run_tokens = require_int("min_run_tokens", min_run_tokens, minimum=1)
        self._min_view_tokens = require_int("min_view_tokens", min_view_tokens, minimum=1)
        self._view_chunk_tokens = require_int("view_chunk_tokens", view_chunk_tokens, minimum=1)
        self._metadata: AttentionMetadata | None = None
        self._plan: StepPlan | None = None
        # K+V bytes per token of the layers seen so far: sizes the decode tiles. Until
        # the first forward tells it, that forward plans the step instead of prepare.
        self._token_bytes: int | None = None
        self._workspace = Workspace()

    def prepare(self, metadata: AttentionMetadata) -> None:
        self._metadata = metadata
        self._plan = None if self._token_bytes is None else self._make_plan(metadata)

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        key_cache: torch.Tensor,  # [N, B, Hkv, D]
        value_cache: torch.Tensor,  # [N, B, Hkv, D]
        metadata: AttentionMetadata,
        *,
        scale: float,
    ) -> torch.Tensor:  # [T, Hq, D]
        assert key_cache.is_contiguous() and value_cache.is_contiguous()
        block_size, kv_heads, head_dim = key_cache.shape[1:]
        token_bytes = 2 * kv_heads * head_dim * key_cache.element_size()
        plan = self._plan
        # Replan for a step that prepare did not see (or before the geometry was known).
        if plan is None or self._metadata is not metadata or self._token_bytes != token_bytes:
            self._token_bytes, self._metadata = token_bytes, metadata
            plan = self._plan = self._make_plan(metadata)
        write_kv(k, v, key_cache, value_cache, metadata.slot_mapping)
        if plan.num_tokens == 0:
            return torch.empty_like(q)
        out_dtype, q = q.dtype, q.to(key_cache.dtype)  # the kernel wants one dtype
        workspace = self._workspace
        block_numel = block_size * kv_heads * head_dim
        workspace.reserve(2 * plan.max_gathered_blocks * block_numel, key_cache)
        outs: list[torch.Tensor] = []  # each [n, Hq, D]
        lses: list[torch.Tensor] = []  # each [n, Hq]

        folded = q.view(q.shape[0], kv_heads, -1, head_dim)  # [T, Hkv, G, D]
        decode_outs: list[torch.Tensor] = []  # each [n, Hkv, G, D]
        decode_lses: list[torch.Tensor] = []  # each [n, Hkv, G]
        row_stride = kv_heads * head_dim
        for view in plan.decode_views:
            # One kernel call on zero-copy strided views: the chunks as the batch axis.
            shape = (view.num_chunks, kv_heads, view.chunk_tokens, head_dim)
            strides = (view.chunk_stride * row_stride, head_dim, row_stride, 1)
            offset = view.start_slot * row_stride
            keys = key_cache.as_strided(shape, strides, key_cache.storage_offset() + offset)
            values = value_cache.as_strided(shape, strides, value_cache.storage_offset() + offset)
            query = folded.index_select(0, view.rows)  # [chunks, Hkv, G, D]
            out, lse = attend(query, keys, values, scale=scale)
            decode_outs.append(out)
            decode_lses.append(lse)
        for tile in plan.decode_tiles:
            keys, values, mask = workspace.gather(tile.keys, key_cache, value_cache, q.dtype)
            query = folded if tile.every_token else folded.index_select(0, tile.rows)
            out, lse = attend(query, keys, values, scale=scale, mask=mask)
            decode_outs.append(out)
            decode_lses.append(lse)
        if decode_outs:  # one copy into [P, Hkv, G, D] order, so flattening is a view
            outs.append(_cat(decode_outs).flatten(1, 2))
            lses.append(_cat(decode_lses).flatten(1, 2))

        if plan.prefills:
            slots_k = key_cache.view(-1, kv_heads, head_dim)  # [N * B, Hkv, D]
            slots_v = value_cache.view(-1, kv_heads, head_dim)
        for prefill in plan.prefills:
            chunk = q[prefill.first_row : prefill.first_row + prefill.num_queries]  # [Q, Hq, D]
            for piece in prefill.pieces:
                span = slice(piece.start_slot, piece.start_slot + piece.num_tokens)
                out, lse = attend(
                    chunk[piece.row_offset :].transpose(0, 1)[None],  # [1, Hq, Q', D]
                    slots_k[span].transpose(0, 1)[None],  # [1, Hkv, n, D], a view
                    slots_v[span].transpose(0, 1)[None],
                    scale=scale,
                    causal=piece.causal,
                )
                outs.append(out[0].transpose(0, 1))
                lses.append(lse[0].transpose(0, 1))
            for gathered in prefill.gathered:
                keys, values, mask = workspace.gather(
                    gathered.keys, key_cache, value_cache, q.dtype
                )
                query = chunk[gathered.row_offset :].transpose(0, 1)[None]
                out, lse = attend(query, keys, values, scale=scale, mask=mask)
                outs.append(out[0].transpose(0, 1))
                lses.append(lse[0].transpose(0, 1))

        parts = _cat(outs)  # [P, Hq, D]
        if plan.merge.one_per_row:
            if plan.merge.in_order:  # the partials are the rows, in order
                return parts.to(out_dtype)
            out = torch.empty(q.shape, dtype=out_dtype, device=q.device)
            return out.index_copy_(0, plan.merge.rows, parts.to(out_dtype))
        part_lses = _cat(lses)
        return merge_partials(parts, part_lses, plan.merge).to(out_dtype)

    def _make_plan(self, metadata: AttentionMetadata) -> StepPlan:
        assert self._token_bytes is not None
        stage_tokens = max(1, self._stage_bytes // self._token_bytes)
        return plan_step(
            metadata,
            min_run_tokens=self._min_run_tokens,
            chunk_tokens=max(1, min(self._chunk_tokens, stage_tokens // 4)),
            stage_tokens=stage_tokens,
            min_view_tokens=self._min_view_tokens,
            view_chunk_tokens=self._view_chunk_tokens,
            # A chunk per thread at least: the kernel shares chunks x kv heads among them.
            min_view_chunks=torch.get_num_threads(),
        )


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)  # one part: no copy
