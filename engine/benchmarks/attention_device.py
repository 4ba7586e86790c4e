"""``kvgov bench attention --device cuda``: decode attention on a GPU, device-timed.

One decode step of one layer for 8 sequences of 4,096 tokens at a 9B model's head
sizes (32 query heads over 8 kv heads: GQA 4; head_dim 128), in the device's default
dtype, 16-token blocks laid out by the engine's ``BlockManager`` as in the CPU bench
(each prompt prefilled in one run, then 512 tokens decoded round-robin). Each timed
call runs 4 layers in turn, 128 MiB of K/V each in bfloat16, more than any GPU's L2,
so every layer reads from memory, as in a real model.

- ``paged_over_contiguous``: ``TritonAttention`` (the new tokens' K/V write included)
  over the faster, in each repeat, of two SDPA calls on the same K/V stored
  contiguously as ``[8, 8, 4096, 128]``: grouped heads folded into the query axis, and
  ``enable_gqa=True`` (target 1.10; vLLM's paged kernel measured 1.20-1.26x the
  contiguous kernel of its day).
- ``gather_over_contiguous``: ``GatherAttention``, the path where triton is absent
  (a padded copy of every sequence, then SDPA with a mask).

Each repeat times baseline and candidate back to back with CUDA events around all
layers (order alternating); a ratio is the median of the per-repeat ratios. Every
path is warmed up first (Triton compiles on its first call).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from engine.attention.gather import GatherAttention
from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_features import sdpa_enable_gqa
from engine.attention.triton_attention import TritonAttention, triton_available
from engine.benchmarks.attention_layout import (
    BLOCK_SIZE,
    NUM_SEQS,
    SEQ_LEN,
    allocator_layout,
    contiguous_kv,
)
from engine.benchmarks.measurement import Direction, Measurement
from engine.device import default_dtype
from engine.kv_cache import KVCache

__all__ = ["run"]

_BENCH = "attention"
_LAYERS = 4
_Q_HEADS, _KV_HEADS, _HEAD_DIM = 32, 8, 128

Layer = Callable[[int], torch.Tensor]


def run(*, quick: bool, seed: int, device: torch.device) -> Iterator[Measurement]:
    repeats = 10 if quick else 50
    dtype = default_dtype(device)
    gen = torch.Generator().manual_seed(seed)
    tables, num_blocks = allocator_layout(seed)
    cache = KVCache(
        num_layers=_LAYERS,
        num_blocks=num_blocks,
        num_kv_heads=_KV_HEADS,
        head_dim=_HEAD_DIM,
        block_size=BLOCK_SIZE,
        dtype=dtype,
        device=device,
    )
    for layer in range(_LAYERS):  # filled a layer at a time: no float32 copy of it all
        for part in (cache.key_cache(layer), cache.value_cache(layer)):
            part.copy_(torch.randn(part.shape, generator=gen).to(dtype))

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen).to(device, dtype)

    q = rand(NUM_SEQS, _Q_HEADS, _HEAD_DIM)
    k = rand(NUM_SEQS, _KV_HEADS, _HEAD_DIM)
    v = rand(NUM_SEQS, _KV_HEADS, _HEAD_DIM)
    scale = _HEAD_DIM**-0.5
    metadata = AttentionMetadata.build(
        block_size=BLOCK_SIZE,
        query_lens=[1] * NUM_SEQS,
        seq_lens=[SEQ_LEN] * NUM_SEQS,
        block_tables=tables,
        device=device,
    )

    def step(backend: TritonAttention | GatherAttention) -> Layer:
        backend.prepare(metadata)
        return lambda layer: backend.forward(
            q, k, v, cache.key_cache(layer), cache.value_cache(layer), metadata, scale=scale
        )

    gather = step(GatherAttention())
    for layer in range(_LAYERS):  # the new tokens, so the contiguous copy has them
        gather(layer)
    contiguous = [
        (contiguous_kv(cache.key_cache(i), tables), contiguous_kv(cache.value_cache(i), tables))
        for i in range(_LAYERS)
    ]
    folded = q.view(NUM_SEQS, _KV_HEADS, -1, _HEAD_DIM)  # [S, Hkv, G, D]
    baselines: dict[str, Layer] = {
        "folded": lambda i: F.scaled_dot_product_attention(folded, *contiguous[i], scale=scale)
    }
    if sdpa_enable_gqa():
        query = q[:, :, None, :]  # [S, Hq, 1, D]
        baselines["enable_gqa"] = lambda i: F.scaled_dot_product_attention(
            query, *contiguous[i], scale=scale, enable_gqa=True
        )

    candidates = {"gather": gather}
    if triton_available():
        candidates["paged"] = step(TritonAttention())
    want = baselines["folded"](0).reshape(NUM_SEQS, _Q_HEADS, _HEAD_DIM).float()
    for name, candidate in candidates.items():  # a ratio of unlike work would be no figure
        got = candidate(0).float()
        if not torch.allclose(got, want, atol=3e-2, rtol=3e-2):
            error = (got - want).abs().max().item()
            raise RuntimeError(f"{name} decode differs from contiguous SDPA by up to {error:.3g}")
    ratios: dict[str, float] = {}
    times: dict[str, list[float]] = {}
    for name, candidate in candidates.items():
        base, cand = _paired(baselines, candidate, repeats=repeats)
        ratios[name] = statistics.median(c / b for c, b in zip(cand, base, strict=True))
        times[name] = cand
        times.setdefault("contiguous", base)

    shape = (
        f"{NUM_SEQS} x {SEQ_LEN:,} tokens, {_Q_HEADS}/{_KV_HEADS} heads, d={_HEAD_DIM}, "
        f"{str(dtype).removeprefix('torch.')}, on {torch.cuda.get_device_name(device)}"
    )
    yield Measurement(
        bench=_BENCH,
        metric="paged_over_contiguous",
        value=ratios.get("paged", float("nan")),
        unit="x",
        target=1.10,
        direction=Direction.LOWER_IS_BETTER,
        note=f"Triton paged decode over contiguous SDPA ({' or '.join(baselines)}, the "
        f"faster per repeat); {shape}; {_LAYERS} layers, CUDA events, median of {repeats}"
        + ("" if "paged" in ratios else "; NOT MEASURED: triton is not installed"),
    )
    yield Measurement(
        bench=_BENCH,
        metric="gather_over_contiguous",
        value=ratios["gather"],
        unit="x",
        direction=Direction.LOWER_IS_BETTER,
        note=f"a padded copy of every sequence, then SDPA with a mask; {shape}",
    )
    for name, samples in times.items():
        yield Measurement(
            bench=_BENCH,
            metric=f"{name}_ms",
            value=1e3 * statistics.median(samples),
            unit="ms",
            direction=Direction.LOWER_IS_BETTER,
            note=f"{name}, per layer, median of {repeats} repeats (device time)",
        )


def _paired(
    baselines: dict[str, Layer], candidate: Layer, *, repeats: int
) -> tuple[list[float], list[float]]:
    """Seconds per layer: the fastest baseline and the candidate, in each repeat."""
    fns = [*baselines.values(), candidate]
    for fn in fns:  # warm up: Triton's compile, cuBLAS/kernel selection, allocations
        for layer in range(_LAYERS):
            fn(layer)
    torch.cuda.synchronize()
    base_times: list[float] = []
    cand_times: list[float] = []
    for i in range(repeats):
        order = fns if i % 2 == 0 else fns[::-1]
        seconds = {}
        for fn in order:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for layer in range(_LAYERS):
                fn(layer)
            stop.record()
            seconds[id(fn)] = (start, stop)
        torch.cuda.synchronize()
        per_layer = {
            key: start.elapsed_time(stop) / 1e3 / _LAYERS for key, (start, stop) in seconds.items()
        }
        base_times.append(min(per_layer[id(fn)] for fn in baselines.values()))
        cand_times.append(per_layer[id(candidate)])
    return base_times, cand_times
