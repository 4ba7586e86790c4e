"""Split-KV paged attention: runs attended in place, fragments gathered, merged by LSE.

The fast backend for CPUs. ``prepare`` plans the step once (``runs.plan_step``); each
layer's ``forward`` then writes the new K/V, and for every query row attends

- each long run of its sequence as a zero-copy strided view of the layer's cache
  (one kernel call per run, however many sequences share the step);
- its sequence's short runs through one gathered copy, batched across decodes;

and merges the partial results with their log-sum-exps. Decodes fold grouped-query
heads into the query axis (``[Hkv, Hq / Hkv]`` query rows per kv head), which needs no
mask since a decode token sees all of its context, and reads each K/V head once.

Cache layout per layer: ``[N, B, Hkv, D]``, contiguous, so slot ``i`` (block
``i // B``, offset ``i % B``) starts at element ``i * Hkv * D``.
"""

from __future__ import annotations

import math

import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.partial import attend, merge_partials
from engine.attention.reference import write_kv
from engine.attention.runs import GatheredKeys, StepPlan, plan_step

__all__ = ["PagedAttention"]


class PagedAttention:
    """Paged attention over zero-copy runs, for CPUs (correct on any device).

    ``min_run_tokens``: runs shorter than this are gathered instead of attended in
    place (on a 2-core CPU one kernel call costs about as much as copying ~64 tokens
    of K/V). ``kv_splits``: a long decode run is split into up to this many chunks in
    one call so more threads share it; defaults to half of torch's intra-op threads.
    """

    name = "paged"

    __slots__ = ("_kv_splits", "_min_run_tokens", "_plan", "_planned_for", "_workspace")

    def __init__(self, *, min_run_tokens: int = 128, kv_splits: int | None = None) -> None:
        if min_run_tokens < 1:
            raise ValueError(f"min_run_tokens must be >= 1, got {min_run_tokens}")
        if kv_splits is not None and kv_splits < 1:
            raise ValueError(f"kv_splits must be >= 1 or None, got {kv_splits}")
        self._min_run_tokens = min_run_tokens
        self._kv_splits = kv_splits
        self._plan: StepPlan | None = None
        self._planned_for: AttentionMetadata | None = None
        # Gathered K/V land here, reused by every layer and step: a fresh multi-MB tensor
        # per layer would cost a page fault per 4 KiB on CPU, more than the copy itself.
        self._workspace = torch.empty(0)

    def prepare(self, metadata: AttentionMetadata) -> None:
        splits = self._kv_splits or max(2, torch.get_num_threads())
        self._plan = plan_step(metadata, min_run_tokens=self._min_run_tokens, kv_splits=splits)
        self._planned_for = metadata

    def _reserve(self, numel: int, like: torch.Tensor) -> torch.Tensor:
        """The workspace, grown (never shrunk) to ``numel`` elements of ``like``'s dtype."""
        ws = self._workspace
        stale = ws.is_inference() and not torch.is_inference_mode_enabled()
        if stale or ws.numel() < numel or ws.dtype != like.dtype or ws.device != like.device:
            ws = torch.empty(max(numel, ws.numel()), dtype=like.dtype, device=like.device)
            self._workspace = ws
        return ws

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
        if self._planned_for is not metadata:
            self.prepare(metadata)  # a caller that skipped prepare still gets the right answer
        plan = self._plan
        assert plan is not None and key_cache.is_contiguous() and value_cache.is_contiguous()
        write_kv(k, v, key_cache, value_cache, metadata.slot_mapping)
        if plan.num_tokens == 0:
            return torch.empty_like(q)
        kv_heads, head_dim = key_cache.shape[2:]
        slots_k = key_cache.view(-1, kv_heads, head_dim)  # [N * B, Hkv, D]
        slots_v = value_cache.view(-1, kv_heads, head_dim)
        block_numel = key_cache[0].numel()
        workspace = self._reserve(2 * plan.num_gathered_blocks * block_numel, key_cache)
        gather = _Gatherer(key_cache, value_cache, workspace, q.dtype)
        outs: list[torch.Tensor] = []  # each [n, Hq, D]
        lses: list[torch.Tensor] = []  # each [n, Hq]

        def keep(out: torch.Tensor, lse: torch.Tensor) -> None:
            outs.append(out)
            lses.append(lse)

        # Decodes: GQA folded, [T, Hkv, G, D]; row r's output heads flatten back in order.
        folded = q.view(q.shape[0], kv_heads, -1, head_dim)
        for run in plan.decode_runs:
            shape = (run.num_chunks, kv_heads, run.chunk_tokens, head_dim)
            stride = (run.chunk_tokens * kv_heads * head_dim, head_dim, kv_heads * head_dim, 1)
            offset = run.start_slot * kv_heads * head_dim
            keys = slots_k.as_strided(shape, stride, slots_k.storage_offset() + offset)
            values = slots_v.as_strided(shape, stride, slots_v.storage_offset() + offset)
            query = folded[run.row].expand(run.num_chunks, *folded.shape[1:])
            out, lse = attend(query, keys, values, scale=scale)
            keep(out.flatten(1, 2), lse.flatten(1, 2))
        for batch in plan.decode_batches:
            keys, values, mask = gather(batch.keys)
            out, lse = attend(
                folded.index_select(0, batch.rows), keys, values, scale=scale, mask=mask
            )
            keep(out.flatten(1, 2), lse.flatten(1, 2))

        for prefill in plan.prefills:
            chunk = q[prefill.first_row : prefill.first_row + prefill.num_queries]  # [Q, Hq, D]
            for piece in prefill.pieces:
                span = slice(piece.start_slot, piece.start_slot + piece.num_tokens)
                out, lse = attend(
                    chunk[piece.row_offset :].transpose(0, 1)[None],
                    slots_k[span].transpose(0, 1)[None],  # [1, Hkv, n, D], a view
                    slots_v[span].transpose(0, 1)[None],
                    scale=scale,
                    causal=piece.causal,
                )
                keep(out[0].transpose(0, 1), lse[0].transpose(0, 1))
            if prefill.gathered is not None:
                keys, values, mask = gather(prefill.gathered)
                query = chunk[prefill.gathered_row_offset :].transpose(0, 1)[None]
                out, lse = attend(query, keys, values, scale=scale, mask=mask)
                keep(out[0].transpose(0, 1), lse[0].transpose(0, 1))

        parts = torch.cat(outs)  # [P, Hq, D]
        if plan.one_partial_per_row:
            return torch.empty_like(q).index_copy_(0, plan.partial_rows, parts.to(q.dtype))
        merged = merge_partials(parts, torch.cat(lses), plan.partial_rows, num_rows=plan.num_tokens)
        return merged.to(q.dtype)


class _Gatherer:
    """Copies gathered blocks into consecutive slices of the workspace."""

    __slots__ = ("_dtype", "_key_cache", "_used", "_value_cache", "_workspace")

    def __init__(
        self,
        key_cache: torch.Tensor,  # [N, B, Hkv, D]
        value_cache: torch.Tensor,
        workspace: torch.Tensor,  # flat, the cache's dtype
        dtype: torch.dtype,
    ) -> None:
        self._key_cache, self._value_cache = key_cache, value_cache
        self._workspace, self._dtype = workspace, dtype
        self._used = 0

    def __call__(
        self, gathered: GatheredKeys
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # [R, Hkv, W * B, D] x 2, mask
        rows = gathered.blocks.shape[0]
        ids = gathered.blocks.flatten()
        return (
            self._copy(ids, self._key_cache, rows),
            self._copy(ids, self._value_cache, rows),
            gathered.mask.to(self._dtype),
        )

    def _copy(self, ids: torch.Tensor, cache: torch.Tensor, rows: int) -> torch.Tensor:
        shape = (ids.numel(), *cache.shape[1:])
        numel = math.prod(shape)
        out = self._workspace[self._used : self._used + numel].view(shape)
        self._used += numel
        torch.index_select(cache, 0, ids, out=out)
        return out.view(rows, -1, *cache.shape[2:]).transpose(1, 2)
