"""Compiling, before the engine serves, every Triton attention kernel a step can launch.

Triton compiles a kernel at its first launch for each new set of constexprs: 1-3 s on a
GPU, which mid-serving is a stalled step for every running sequence. The model's shapes
are fixed at startup, and what a step passes is kept to one specialization whatever the
batch (``engine.attention.triton_attention``), so the kernels a step can launch are one
prefill and one decode per ``NUM_SPLITS`` (the split count padded to a power of two),
plus the merge of each split one (``TritonAttention.decode_variants``). At startup on a
GPU the engine runs each through the model once: one decode row of the variant's length,
then a prefill chunk, all on block 0 of the cache (free at startup, zeroed afterwards),
and logs how long that took. On a CPU there is nothing to compile (Triton is taken there
only by name, interpreted). The quantized matmul's kernels, unsplit and split-K, are
compiled earlier, by the probe that chooses them when the model loads
(``engine.quantization.triton_probe``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from engine.attention.triton_attention import TritonAttention
from engine.model_runner import ModelRunner

__all__ = ["AttentionWarmup", "run_attention_variants", "warm_up_attention"]

logger = logging.getLogger(__name__)

_PREFILL_TOKENS = 3  # a chunk of a few tokens launches the prefill kernel


@dataclass(frozen=True, slots=True)
class AttentionWarmup:
    variants: dict[int, int]  # NUM_SPLITS -> the decode length that launched it
    seconds: float


def warm_up_attention(runner: ModelRunner, *, max_len: int) -> AttentionWarmup | None:
    """Compile the runner's Triton attention kernels for every variant a step can launch
    with sequences of up to ``max_len`` tokens; ``None`` where there is nothing to
    compile (another backend, or not a CUDA/ROCm device)."""
    attention = runner.attention
    if not isinstance(attention, TritonAttention) or runner.device.type != "cuda":
        return None
    warmup = run_attention_variants(runner, attention, max_len=max_len)
    logger.info(
        "Triton attention compiled before serving in %.1f s: prefill, decode with "
        "NUM_SPLITS %s (rows of up to %d tokens)",
        warmup.seconds,
        ", ".join(map(str, warmup.variants)),
        max(warmup.variants.values()),
    )
    return warmup


def run_attention_variants(
    runner: ModelRunner, attention: TritonAttention, *, max_len: int
) -> AttentionWarmup:
    """Launch each variant once through the model (``warm_up_attention``, minus the
    device check: under Triton's interpreter this runs on a CPU)."""
    cache = runner.kv_cache
    start = time.perf_counter()
    variants = attention.decode_variants(
        kv_heads=cache.num_kv_heads, max_len=max_len, device=runner.device
    )
    items = [_on_block_zero(length - 1, 1, cache.block_size) for length in variants.values()]
    items.append(_on_block_zero(0, _PREFILL_TOKENS, cache.block_size))
    for item in items:  # one at a time: a step's decodes share one split count
        runner.forward([item])
    cache.kv[:, :, 0].zero_()  # what the launches wrote; no request holds block 0 yet
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)  # the time includes the launches' own
    return AttentionWarmup(variants=variants, seconds=time.perf_counter() - start)


def _on_block_zero(
    start: int, num_tokens: int, block_size: int
) -> tuple[list[int], int, int, list[int]]:
    """``ModelRunner.forward``'s item for ``num_tokens`` tokens after ``start`` cached
    ones, every block of it block 0 (token 0 throughout: only the launches matter)."""
    end = start + num_tokens
    return [0] * end, start, num_tokens, [0] * -(-end // block_size)
