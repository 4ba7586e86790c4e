"""Decode steps replayed as CUDA/HIP graphs: one launch instead of about a thousand.

An 8B decode step launches about 1,000 kernels (per layer RMSNorm's few ops, RoPE's, the
KV write, attention and four GEMMs); on an H100 launching them takes the host longer
than the GPU takes to run them, and on the reference card about as long. As vLLM and
SGLang do, a decode step whose batch fits a captured graph replays it: the batch is
padded to the graph's size, its token ids, positions, slots, context lengths and block
tables are copied into static device buffers (from pinned memory, the host not waiting),
and the graph runs the whole model up to the final norm. Sampling stays outside the
graph (each request has its own parameters).

Graphs are captured at startup (``capture``) for every pair of a batch size (1, 2, 4,
then multiples of 8 up to ``max_num_seqs``, vLLM's capture sizes) and a context class
(1k, 4k, 16k, 64k tokens, then ``max_model_len``): a decode's split count, and so the
attention kernels' grid, is fixed by the longest context the graph serves, so a graph
per class keeps a short batch from paying for a long one's partitions. All graphs share
one memory pool. A padding row decodes token 0 at position 0 into ``scratch_block``, a
block no request ever owns, with one token of context.

Only the Triton attention backend plans a step in device tensors whose addresses stay
put (``TritonAttention.prepare`` builds them once per graph; the graph keeps them); the
CPU's backends plan on the host. So graphs run where the engine is on a GPU with Triton
attention and ``enforce_eager`` is off; a capture that fails leaves the engine eager,
with one logged line. ``capture=False`` runs the same static buffers and plans eagerly
(the CPU tests, under Triton's interpreter: the buffers, padding and plans are checked
without a GPU; the capture itself is a ``gpu`` test).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.attention.triton_attention import TritonAttention
from engine.errors import InvalidRequestError
from engine.host_staging import stage_tensor
from engine.kv_cache import KVCache
from engine.models.llama import LlamaForCausalLM

__all__ = [
    "GRAPH_MODES",
    "DecodeGraphs",
    "capture_sizes",
    "context_classes",
    "set_up_decode_graphs",
    "wants_decode_graphs",
]

logger = logging.getLogger(__name__)

# (token_ids, num_computed, num_tokens, block_ids) of each sequence, as ModelRunner.run
Item = tuple[Sequence[int], int, int, Sequence[int]]

# EngineConfig.decode_graphs: "auto" captures them on a GPU with Triton attention; "off"
# never (vLLM's enforce_eager); "eager" runs their static buffers and plans without
# capturing, wherever Triton runs (tests under the interpreter).
GRAPH_MODES = ("auto", "off", "eager")


def wants_decode_graphs(mode: str, attention: AttentionBackend, device: torch.device) -> bool:
    """Whether an engine with this attention on this device sets up decode graphs (and
    so keeps a scratch block out of its pool)."""
    if mode not in GRAPH_MODES:
        raise InvalidRequestError(f"decode_graphs must be one of {GRAPH_MODES}, got {mode!r}")
    triton = isinstance(attention, TritonAttention)
    if mode == "eager" and not triton:
        raise InvalidRequestError(
            "decode_graphs='eager' runs the graphs' static path, which needs the Triton "
            f"attention backend (this engine has {attention.name!r}): pass attention='triton'"
        )
    return mode == "eager" or (mode == "auto" and triton and device.type == "cuda")


def set_up_decode_graphs(
    *,
    mode: str,
    model: LlamaForCausalLM,
    kv_cache: KVCache,
    max_num_seqs: int,
    max_model_len: int,
    scratch_block: int,
) -> DecodeGraphs | None:
    """The engine's decode graphs, captured (or, ``eager``, planned); ``None`` with one
    logged line where capturing fails, the engine then decoding eagerly."""
    graphs = DecodeGraphs(
        model=model,
        kv_cache=kv_cache,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        scratch_block=scratch_block,
    )
    try:
        seconds = graphs.capture(graphs=mode == "auto")
    except Exception as exc:  # a capture error has many types; any means "eager here"
        logger.warning(
            "decode graphs not captured on %s (%s: %s): decode steps run eagerly",
            kv_cache.device,
            type(exc).__name__,
            exc,
        )
        if kv_cache.device.type == "cuda":
            torch.cuda.empty_cache()
        return None
    logger.info(
        "%d decode graphs %s in %.1f s: batches of %s, contexts of up to %s tokens",
        len(graphs.batch_sizes) * len(graphs.lengths),
        "captured" if mode == "auto" else "planned (eager)",
        seconds,
        ", ".join(map(str, graphs.batch_sizes)),
        ", ".join(f"{n:,}" for n in graphs.lengths),
    )
    return graphs


def capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """Batch sizes with a graph: 1, 2, 4, then every multiple of 8, up to
    ``max_num_seqs`` (itself included, so every batch the engine runs has one)."""
    sizes = [n for n in (1, 2, 4) if n < max_num_seqs]
    sizes += range(8, max_num_seqs, 8)
    return (*sizes, max_num_seqs)


def context_classes(max_model_len: int) -> tuple[int, ...]:
    """The longest context each graph serves: 1k, 4k, 16k, 64k, ... below
    ``max_model_len``, then ``max_model_len``."""
    classes = []
    length = 1024
    while length < max_model_len:
        classes.append(length)
        length *= 4
    return (*classes, max_model_len)


@dataclass(frozen=True, slots=True)
class _Graph:
    graph: Any  # torch.cuda.CUDAGraph, or None where replays run eagerly
    hidden: torch.Tensor  # [batch, H]: the output every replay writes
    metadata: AttentionMetadata  # static views of the buffers
    plan: object  # the backend's plan for it: its tensors must outlive the graph


class DecodeGraphs:
    def __init__(
        self,
        *,
        model: LlamaForCausalLM,
        kv_cache: KVCache,
        max_num_seqs: int,
        max_model_len: int,
        scratch_block: int,
    ) -> None:
        self.model = model
        self.attention = model.attention
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.batch_sizes = capture_sizes(max_num_seqs)
        self.lengths = context_classes(max_model_len)
        self.scratch_block = scratch_block
        width = -(-max_model_len // self.block_size)
        most = self.batch_sizes[-1]
        device = kv_cache.device
        self._ids = torch.zeros(most, dtype=torch.int64, device=device)
        self._positions = torch.zeros(most, dtype=torch.int64, device=device)
        self._slots = torch.full(
            (most,), scratch_block * self.block_size, dtype=torch.int64, device=device
        )
        # int32, as the Triton kernels read them: their plan then holds these very tensors
        self._seq_lens = torch.ones(most, dtype=torch.int32, device=device)
        self._tables = torch.full((most, width), scratch_block, dtype=torch.int32, device=device)
        self._starts = torch.arange(most + 1, dtype=torch.int64, device=device)
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self.captured = False

    def capture(self, *, graphs: bool = True) -> float:
        """Record every (batch, context class) pair, largest first so that the later
        ones fit in the pool the first one sized; returns the seconds it took. With
        ``graphs`` False the pairs are only planned (and each run once, eagerly)."""
        began = time.perf_counter()
        pool = None
        keys = [(b, n) for b in self.batch_sizes for n in self.lengths]
        for batch, length in sorted(keys, reverse=True):
            metadata = self._metadata(batch, length)
            self.attention.prepare(metadata)
            plan = getattr(self.attention, "_plan", None)
            hidden = self._forward(batch, metadata)  # compiles, and sizes torch's workspaces
            graph = None
            if graphs:
                torch.cuda.synchronize(self.kv_cache.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    hidden = self._forward(batch, metadata)
                pool = graph.pool()
            self._graphs[batch, length] = _Graph(graph, hidden, metadata, plan)
        self.captured = graphs
        return time.perf_counter() - began

    def fits(self, items: Sequence[Item]) -> bool:
        """Whether a step is a decode of every sequence that a graph serves."""
        return (
            bool(self._graphs)
            and 0 < len(items) <= self.batch_sizes[-1]
            and all(num == 1 for _, _, num, _ in items)
            and max(start + 1 for _, start, _, _ in items) <= self.lengths[-1]
        )

    def run(self, items: Sequence[Item]) -> torch.Tensor:
        """The hidden states [len(items), H] of a decode step (``fits``), from the
        graph of the smallest batch and context class that hold it. Valid until the
        next ``run``."""
        num = len(items)
        batch = self.batch_sizes[bisect.bisect_left(self.batch_sizes, num)]
        longest = max(start + 1 for _, start, _, _ in items)
        length = self.lengths[bisect.bisect_left(self.lengths, longest)]
        width = -(-longest // self.block_size)
        ids, positions, slots, seq_lens = [], [], [], []
        tables = torch.full((batch, width), self.scratch_block, dtype=torch.int32)
        for row, (token_ids, start, _, blocks) in enumerate(items):
            ids.append(token_ids[start])
            positions.append(start)
            slots.append(
                blocks[start // self.block_size] * self.block_size + start % self.block_size
            )
            seq_lens.append(start + 1)
            used = -(-(start + 1) // self.block_size)
            tables[row, :used] = torch.tensor(blocks[:used], dtype=torch.int32)
        pad = batch - num
        scratch_slot = self.scratch_block * self.block_size
        device = self.kv_cache.device
        longs = torch.tensor(
            [*ids, *[0] * pad, *positions, *[0] * pad, *slots, *[scratch_slot] * pad],
            dtype=torch.int64,
        )
        staged = stage_tensor(longs, device).view(3, batch)
        self._ids[:batch].copy_(staged[0])
        self._positions[:batch].copy_(staged[1])
        self._slots[:batch].copy_(staged[2])
        ints = torch.cat(
            [torch.tensor([*seq_lens, *[1] * pad], dtype=torch.int32), tables.view(-1)]
        )
        staged_ints = stage_tensor(ints, device)
        self._seq_lens[:batch].copy_(staged_ints[:batch])
        self._tables[:batch, :width].copy_(staged_ints[batch:].view(batch, width))
        chosen = self._graphs[batch, length]
        if chosen.graph is not None:
            chosen.graph.replay()
            return chosen.hidden[:num]
        self.attention.prepare(chosen.metadata)  # eager: the same plan, made again
        return self._forward(batch, chosen.metadata)[:num]

    def _forward(self, batch: int, metadata: AttentionMetadata) -> torch.Tensor:
        with torch.inference_mode():
            return self.model(self._ids[:batch], self._positions[:batch], self.kv_cache, metadata)

    def _metadata(self, batch: int, length: int) -> AttentionMetadata:
        """Static views of the buffers for a graph; its host mirrors say every row may
        be ``length`` long, which fixes the decode's split count (the kernels read each
        row's true length from ``seq_lens``)."""
        blocks = -(-length // self.block_size)
        return AttentionMetadata(
            block_size=self.block_size,
            query_start_loc=self._starts[: batch + 1],
            seq_lens=self._seq_lens[:batch],
            block_tables=self._tables[:batch],
            slot_mapping=self._slots[:batch],
            query_lens_cpu=(1,) * batch,
            seq_lens_cpu=(length,) * batch,
            block_tables_cpu=((self.scratch_block,) * blocks,) * batch,
        )
