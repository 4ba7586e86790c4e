"""Turns a scheduled step into tensors, runs the model and samples.

Torch lives here and below (layers, models, attention); the scheduler and block manager
above stay plain Python.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata, stage_int64
from engine.block_manager import BlockManager
from engine.decode_graphs import DecodeGraphs
from engine.kv_cache import KVCache
from engine.models.llama import LlamaForCausalLM
from engine.request import Request
from engine.sampling import Sampler
from engine.scheduler import ScheduledChunk
from engine.step_threads import StepThreads

__all__ = ["ModelRunner"]


class ModelRunner:
    def __init__(
        self,
        *,
        model: LlamaForCausalLM,
        attention: AttentionBackend,
        kv_cache: KVCache,
        block_manager: BlockManager,
        threads: StepThreads | None = None,
    ) -> None:
        self.model = model
        self.attention = attention
        self.kv_cache = kv_cache
        self.manager = block_manager
        self.device = kv_cache.device
        self.sampler = Sampler()
        self.threads = threads  # the CPU threads a step runs on (None: torch's, as set)
        self.graphs: DecodeGraphs | None = None  # set by the engine where it has them

    def execute(self, chunks: Sequence[ScheduledChunk]) -> list[int | None]:
        """Compute every chunk's tokens; for chunks that complete their request's known
        tokens, sample the next token (``None`` for the others). On ``threads``' count
        (``engine.step_threads``): a step of one token per sequence is a decode step
        that it times."""
        if self.threads is None or not chunks:
            return self._execute(chunks)
        decode = all(chunk.num_tokens == 1 for chunk in chunks)
        return self.threads.run(
            lambda: self._execute(chunks), batch=len(chunks) if decode else None
        )

    @torch.inference_mode()
    def _execute(self, chunks: Sequence[ScheduledChunk]) -> list[int | None]:
        """``execute`` on the threads in force.

        On a GPU nothing here reads a device value on the host until the sampled tokens:
        inputs, metadata and the rows to sample are staged in one pinned buffer and
        copied once, non-blocking (``AttentionMetadata.build_staged``).
        """
        if not chunks:
            return []
        ends, sampling_rows = [], []
        end = 0
        for chunk in chunks:
            end += chunk.num_tokens
            if chunk.completes:
                ends.append(end - 1)
                sampling_rows.append(chunk.request)
        items = [
            (
                chunk.request.token_ids,
                chunk.request.num_computed_tokens,
                chunk.num_tokens,
                self.manager.block_ids(chunk.request.request_id),
            )
            for chunk in chunks
        ]
        if self.graphs is not None and len(ends) == len(chunks) and self.graphs.fits(items):
            hidden = self.graphs.run(items)  # a decode of every sequence: one graph replay
        else:
            hidden, rows = self.run(items, sample_rows=ends)
            hidden = hidden[rows]
        results: list[int | None] = [None] * len(chunks)
        if not ends:
            return results
        sampled = self.sample(hidden, sampling_rows).tolist()  # the step's one sync
        row = 0
        for index, chunk in enumerate(chunks):
            if chunk.completes:
                results[index] = sampled[row]
                row += 1
        return results

    def sample(self, hidden: torch.Tensor, requests: Sequence[Request]) -> torch.Tensor:
        """One token per row of ``hidden`` [S, H], int64 on the device, read by no one
        yet. Greedy rows never need the full logits (``LlamaForCausalLM.greedy_tokens``);
        the others go to the sampler."""
        greedy = [i for i, r in enumerate(requests) if r.sampling.is_greedy]
        if len(greedy) == len(requests):
            return self.model.greedy_tokens(hidden)
        others = [i for i, r in enumerate(requests) if not r.sampling.is_greedy]
        greedy_rows, other_rows = stage_int64([greedy, others], self.device)
        tokens = torch.empty(len(requests), dtype=torch.int64, device=self.device)
        if greedy:
            tokens[greedy_rows] = self.model.greedy_tokens(hidden[greedy_rows])
        tokens[other_rows] = self.sampler.sample(
            self.model.compute_logits(hidden[other_rows]),
            [requests[i].sampling for i in others],
            [requests[i].generator for i in others],
        )
        return tokens

    @torch.inference_mode()
    def forward(
        self, items: Sequence[tuple[Sequence[int], int, int, Sequence[int]]]
    ) -> torch.Tensor:
        """Run the model over ``(token_ids, start, num_tokens, block_ids)`` items: the
        tokens ``token_ids[start : start + num_tokens]`` of each sequence, whose blocks
        already hold the K/V of every earlier token. Returns hidden states [T, hidden]."""
        return self.run(items, sample_rows=[])[0]

    def run(
        self,
        items: Sequence[tuple[Sequence[int], int, int, Sequence[int]]],
        *,
        sample_rows: Sequence[int],
    ) -> tuple[torch.Tensor, torch.Tensor]:  # hidden [T, H], sample_rows on the device
        """``forward``, and the rows ``sample_rows`` of the result staged with its inputs."""
        input_ids: list[int] = []
        positions: list[int] = []
        for token_ids, start, num_tokens, _ in items:
            input_ids.extend(token_ids[start : start + num_tokens])
            positions.extend(range(start, start + num_tokens))
        metadata, (input_tensor, position_tensor, rows) = AttentionMetadata.build_staged(
            block_size=self.kv_cache.block_size,
            query_lens=[num for _, _, num, _ in items],
            seq_lens=[start + num for _, start, num, _ in items],
            block_tables=[blocks for _, _, _, blocks in items],
            device=self.device,
            extra=[input_ids, positions, sample_rows],
        )
        self.attention.prepare(metadata)
        hidden = self.model(input_tensor, position_tensor, self.kv_cache, metadata)
        return hidden, rows
