"""``kvgov bench attention``: paged decode attention against SDPA on contiguous K/V.

One decode step of one layer for 8 sequences of 4,096 tokens with the tiny-random head
sizes, the new tokens' K/V write included. Each ratio (``paged_over_contiguous``,
``fragmented_over_contiguous``, ``naive_gather_over_contiguous``) is measured as a pair
against the fastest SDPA on contiguous K/V, interleaved call by call, over enough layers
that every layer reads cold memory. What each figure measures, the baseline, and where
``paged_over_contiguous`` stops on this CPU: docs/benchmarks.md (``kvgov bench attention``).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.attention.backend import AttentionBackend
from engine.attention.gather import GatherAttention
from engine.attention.metadata import AttentionMetadata
from engine.attention.paged import PagedAttention
from engine.attention.torch_features import sdpa_enable_gqa
from engine.benchmarks.attention_layout import (
    BLOCK_SIZE,
    DECODED,
    NUM_SEQS,
    SEQ_LEN,
    allocator_layout,
    contiguous_kv,
)
from engine.benchmarks.measurement import Direction, Measurement
from engine.device import resolve_device
from engine.kv_cache import KVCache

__all__ = ["run"]

_BENCH = "attention"
_MIN_LAYERS = 4
_Q_HEADS, _KV_HEADS, _HEAD_DIM = 8, 2, 32
LAYER_BYTES = 2 * NUM_SEQS * SEQ_LEN * _KV_HEADS * _HEAD_DIM * 4  # K and V, float32
_MIB = 1 << 20
# The last-level cache assumed where the OS does not report one (32 MiB: a common L3).
_DEFAULT_LLC_BYTES = 32 * _MIB

Layer = Callable[[int], object]  # runs one layer's attention


def last_level_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """The largest data or unified cache of CPU 0 as Linux reports it (its L3 on x86)."""
    sizes = []
    for index in root.glob("index*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            size = (index / "size").read_text().strip()  # e.g. "307200K"
        except OSError:
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        if size[-1:] in units and size[:-1].isdigit():
            sizes.append(int(size[:-1]) * units[size[-1]])
        elif size.isdigit():
            sizes.append(int(size))
    return max(sizes, default=_DEFAULT_LLC_BYTES)


def num_layers_for(llc_bytes: int) -> int:
    """Layers whose K/V together are at least twice ``llc_bytes`` (and at least 4)."""
    return max(_MIN_LAYERS, -(-2 * llc_bytes // LAYER_BYTES))


def run(
    *,
    quick: bool = False,
    seed: int = 0,
    num_layers: int | None = None,
    device: str | torch.device = "cpu",
) -> Iterator[Measurement]:
    """``num_layers``: ``None`` sizes the K/V to the machine's last-level cache
    (``num_layers_for``); tests pass a few to run quickly. On a GPU (``device``) the
    decode microbenchmark of ``attention_device`` runs instead."""
    resolved = resolve_device(device)
    if resolved.type != "cpu":
        from engine.benchmarks import attention_device

        yield from attention_device.run(quick=quick, seed=seed, device=resolved)
        return
    repeats = 9 if quick else 41
    llc = last_level_cache_bytes()
    num_layers = num_layers_for(llc) if num_layers is None else num_layers
    gen = torch.Generator().manual_seed(seed)
    tables, num_blocks = allocator_layout(seed)
    cache = KVCache(
        num_layers=num_layers,
        num_blocks=num_blocks,
        num_kv_heads=_KV_HEADS,
        head_dim=_HEAD_DIM,
        block_size=BLOCK_SIZE,
        dtype=torch.float32,
        device="cpu",
    )
    cache.kv.copy_(torch.randn(cache.kv.shape, generator=gen))
    q = torch.randn(NUM_SEQS, _Q_HEADS, _HEAD_DIM, generator=gen)
    k = torch.randn(NUM_SEQS, _KV_HEADS, _HEAD_DIM, generator=gen)
    v = torch.randn(NUM_SEQS, _KV_HEADS, _HEAD_DIM, generator=gen)
    scale = _HEAD_DIM**-0.5
    runs_md = _metadata(tables)

    def step(backend: AttentionBackend, md: AttentionMetadata) -> Layer:
        backend.prepare(md)
        return lambda layer: backend.forward(
            q, k, v, cache.key_cache(layer), cache.value_cache(layer), md, scale=scale
        )

    paged = PagedAttention()
    write = step(paged, runs_md)
    for layer in range(num_layers):  # the new tokens, so the contiguous copy has them
        write(layer)
    contiguous = [  # the same K/V, one [S, Hkv, L, D] pair per layer
        (contiguous_kv(cache.key_cache(i), tables), contiguous_kv(cache.value_cache(i), tables))
        for i in range(num_layers)
    ]
    folded = q.view(NUM_SEQS, _KV_HEADS, -1, _HEAD_DIM)  # [S, Hkv, G, D]

    def sdpa(layer: int) -> object:
        return F.scaled_dot_product_attention(folded, *contiguous[layer], scale=scale)

    candidates = {
        "paged": write,
        "fragmented": step(PagedAttention(), _metadata(_shuffled(tables, num_blocks, seed))),
        "naive_gather": step(GatherAttention(), runs_md),
    }
    ratios, times = {}, {}
    for name, candidate in candidates.items():
        base, cand = _paired(sdpa, candidate, layers=num_layers, repeats=repeats)
        ratios[name] = statistics.median(c / b for c, b in zip(cand, base, strict=True))
        times[name] = statistics.median(cand)
        times.setdefault("contiguous", statistics.median(base))
    times["prepare"] = _alone(lambda _: paged.prepare(runs_md), layers=1, repeats=repeats)
    if sdpa_enable_gqa():
        query = q[:, :, None, :]  # [S, Hq, 1, D]
        times["sdpa_enable_gqa"] = _alone(
            lambda i: F.scaled_dot_product_attention(
                query, *contiguous[i], scale=scale, enable_gqa=True
            ),
            layers=num_layers,
            repeats=repeats,
        )

    layout = f"{NUM_SEQS} x {SEQ_LEN:,} tokens, {_Q_HEADS}/{_KV_HEADS} heads, d={_HEAD_DIM}"
    setup = (
        f"{num_layers} layers x {LAYER_BYTES // _MIB} MiB of K/V = "
        f"{num_layers * LAYER_BYTES // _MIB:,} MiB per side against a "
        f"{llc // _MIB:,} MiB last-level cache, {torch.get_num_threads()} threads"
    )
    yield Measurement(
        bench=_BENCH,
        metric="paged_over_contiguous",
        value=ratios["paged"],
        unit="x",
        target=1.15,
        direction=Direction.LOWER_IS_BETTER,
        note=f"{layout}; prompts in runs, then {DECODED} tokens decoded round-robin; {setup}",
    )
    yield Measurement(
        bench=_BENCH,
        metric="fragmented_over_contiguous",
        value=ratios["fragmented"],
        unit="x",
        direction=Direction.LOWER_IS_BETTER,
        note="the same with every block id shuffled: no runs at all",
    )
    yield Measurement(
        bench=_BENCH,
        metric="naive_gather_over_contiguous",
        value=ratios["naive_gather"],
        unit="x",
        direction=Direction.LOWER_IS_BETTER,
        note="a fresh copy of every sequence each step, then SDPA; swings ~1.3x-6x from "
        "run to run as the allocator does or does not page-fault the 16 MiB copy",
    )
    for name, seconds in times.items():
        yield Measurement(
            bench=_BENCH,
            metric=f"{name}_ms",
            value=1e3 * seconds,
            unit="ms",
            direction=Direction.LOWER_IS_BETTER,
            note=_NOTES[name],
        )


_NOTES = {
    "contiguous": "SDPA on contiguous [8, 2, 4096, 32] K/V per layer, GQA folded into queries",
    "paged": "fast paged backend, per layer, KV write included",
    "fragmented": "fast paged backend on shuffled blocks, per layer",
    "naive_gather": "gather into a fresh copy, then SDPA, per layer",
    "prepare": "the paged backend's plan, once per step for all layers",
    "sdpa_enable_gqa": "SDPA on contiguous K/V with enable_gqa=True, per layer",
}


def _paired(
    base: Layer, candidate: Layer, *, layers: int, repeats: int
) -> tuple[list[float], list[float]]:
    """Seconds per layer of each, every repeat running both over all layers in turn."""
    for fn in (base, candidate):  # warm up: allocations, thread pool, lazy feature checks
        fn(0)
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(repeats):
        for j in (i % 2, 1 - i % 2):  # alternate which goes first
            fn = (base, candidate)[j]
            start = time.perf_counter()
            for layer in range(layers):
                fn(layer)
            times[j].append((time.perf_counter() - start) / layers)
    return times


def _alone(fn: Layer, *, layers: int, repeats: int) -> float:
    fn(0)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for layer in range(layers):
            fn(layer)
        samples.append((time.perf_counter() - start) / layers)
    return statistics.median(samples)


def _metadata(block_tables: list[list[int]]) -> AttentionMetadata:
    return AttentionMetadata.build(
        block_size=BLOCK_SIZE,
        query_lens=[1] * NUM_SEQS,
        seq_lens=[SEQ_LEN] * NUM_SEQS,
        block_tables=block_tables,
        device=torch.device("cpu"),
    )


def _shuffled(tables: list[list[int]], num_blocks: int, seed: int) -> list[list[int]]:
    ids = list(range(num_blocks))
    random.Random(seed + 1).shuffle(ids)
    return [[ids[b] for b in table] for table in tables]
